"""Does turning a lookup on in llama-server change plain decoding's speed when it drafts nothing?

On the demo pair the tuning run found lookups that accepted no draft (ngram-map-k: 0 drafted,
ngram-mod: 49 drafted, 0 accepted) decoding 5-7% faster than plain. This script times plain
against ``ngram-map-k`` and against an ``ngram-simple`` whose n-gram (N = 64) can never match in
64 tokens, on held-out prompts of the deep-tree run, and sets llama-server's own decode time
(``predicted_ms``) beside the client's round trip less the prefill (``prompt_ms``): if the gap is
in both, it is llama-server's decoding, not its clock.

    python scripts/llamacpp_idle_lookup.py [--per-domain 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specscope.models import load_tokenizer
from specscope.models.demo import demo_gguf
from specscope.records import load_run
from specscope.serving.llamacpp.backend import candidate_settings, requests_frame, time_candidates
from specscope.serving.llamacpp.programs import build_llama_tools
from specscope.serving.llamacpp.server import ServerSetting
from specscope.serving.llamacpp.study import held_out_prompts, rendered

RUN = Path(__file__).resolve().parents[1] / "results" / "demo-pair" / "deep-tree"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-domain", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    run = load_run(RUN)
    items = held_out_prompts(run.manifest, args.per_domain)
    prompts = rendered(items, load_tokenizer("demo:target"), "task", 512)
    settings = candidate_settings(["ngram-map-k", "ngram-simple:n=64,m=64"], ServerSetting())
    _, requests = time_candidates(
        build_llama_tools(), demo_gguf("target"), None, settings, prompts, 64, args.repeats
    )
    df = requests_frame(requests)
    df["later"] = df.tokens - 1
    df["client_decode_s"] = df.wall_s - df.prompt_s
    g = df.groupby("candidate")[["later", "decode_s", "client_decode_s", "draft_n", "accepted"]]
    table = g.sum()
    table["server tok/s"] = table.later / table.decode_s
    table["client tok/s"] = table.later / table.client_decode_s
    plain = table.loc["plain"]
    table["server vs plain"] = table["server tok/s"] / plain["server tok/s"]
    table["client vs plain"] = table["client tok/s"] / plain["client tok/s"]
    print(table.round(3).to_markdown())


if __name__ == "__main__":
    main()
