"""llama-server's ngram-simple against specscope's ``llama-ngram-simple`` drafter, request by request:
llama-server decodes each prompt (the demo target GGUF, greedy, ``--spec-type ngram-simple`` with N
and M), and its own counters (``draft_n``, ``draft_n_accepted``) are compared with what the drafter
drafts and accepts along the same prompt and output tokens
(:func:`lab.llama_router.lookup_chain_counts`). Equal counters on every request
mean the re-written rule is llama.cpp's.

    python scripts/llamacpp_ngram_counters.py --ngram-size 3 --m 8 --per-domain 3

Prompts: the offline sources, seed 7 (not the preset's 42), rendered as ``task`` by the demo
target's tokenizer and sent to llama-server as token ids. Needs llama.cpp's programs
(``specscope.serving.llamacpp.programs.build_llama_tools``) and the demo extra.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specscope.drafters import DrafterConfig, lookup_for
from specscope.models import load_tokenizer
from specscope.models.demo import demo_gguf
from specscope.prompts.domains import DOMAINS, select_prompts
from specscope.prompts.render import render_item
from specscope.serving.llamacpp.programs import build_llama_tools
from specscope.serving.llamacpp.server import LlamaServer, ServerSetting

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/, in a checkout
from lab.llama_router import lookup_chain_counts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ngram-size", type=int, default=12, help="N (llama.cpp's default 12)")
    parser.add_argument("--m", type=int, default=48, help="M, the most drafted (default 48)")
    parser.add_argument("--per-domain", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    n, m, new = args.ngram_size, args.m, args.max_new_tokens
    tokenizer = load_tokenizer("demo:target")
    lookup = lookup_for(DrafterConfig("llama-ngram-simple", ngram_size=n))
    setting = ServerSetting(threads=2, poll=0, k=m, spec_type="ngram-simple", ngram_size=n)
    equal = total = drafted = accepted = 0
    start = time.perf_counter()
    with LlamaServer(build_llama_tools(), demo_gguf("target"), setting) as server:
        for item in select_prompts(list(DOMAINS), args.per_domain, seed=7):
            ids = list(render_item(tokenizer, item, "task", 512).ids)
            out = server.complete(ids, new)
            replay = lookup_chain_counts(ids, out.tokens, lookup, m, n_predict=new)
            same = (out.draft_n, out.draft_n_accepted) == (replay.drafted, replay.accepted)
            equal, total = equal + same, total + 1
            drafted, accepted = drafted + out.draft_n, accepted + out.draft_n_accepted
            print(
                f"{item.domain:9} {item.id:28} {len(out.tokens):3} tokens ({out.stop_type}): "
                f"llama-server drafted/accepted {out.draft_n}/{out.draft_n_accepted}, replay "
                f"{replay.drafted}/{replay.accepted}: {'equal' if same else 'DIFFERENT'}"
            )
    print(
        f"N = {n}, M = {m}: {equal} of {total} requests equal; llama-server drafted {drafted} "
        f"tokens and accepted {accepted}; {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
