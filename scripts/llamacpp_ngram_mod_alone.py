"""Does ngram-mod draft on a prompt by itself, or because of the requests before it?

llama-server's ngram-mod keeps one n-gram pool for the server's life (llama.cpp
common/speculative.cpp, ``common_speculative_impl_ngram_mod``: "shared across all sequences",
every prompt's n-grams added in ``begin``, cleared only at 25% occupancy or after 5 drafts in a
row that accept under a quarter). In a bench, a prompt then drafts from what earlier prompts
and outputs put there. This times each of a llama-server bench's held-out prompts of one domain
on a freshly started ngram-mod server (nothing before it) and prints, beside the bench's own
requests of that setting (every earlier prompt of the bench before it), the drafted and
accepted tokens of each.

    python scripts/llamacpp_ngram_mod_alone.py results/demo-pair/llamacpp/poll --domain reasoning
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from specscope.cache import local_path
from specscope.models import load_tokenizer
from specscope.serving.llamacpp.programs import build_llama_tools
from specscope.serving.llamacpp.server import LlamaServer, ServerSetting
from specscope.serving.llamacpp.study import rendered
from specscope.tune.bench import bench_prompts
from specscope.tune.policy import PolicyFile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_dir", type=Path)
    parser.add_argument("--domain", default="reasoning")
    parser.add_argument("--candidate", default="ngram-mod")
    parser.add_argument("--per-domain", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    policy = PolicyFile.load(args.bench_dir / "policy.json")
    entry = policy.info["llama_server"]["candidates"][args.candidate]
    setting = ServerSetting.from_dict(entry["server_setting"])
    tuned = policy.info["tune"]
    domains = ["code", "math", "reasoning", "chat"]
    chosen = bench_prompts(domains, args.per_domain, args.seed, policy, "rules", split=False)
    items = [it for it in chosen.items if it.domain == args.domain]
    pair = policy.info["source"]["target"]["measured"]
    tokenizer = load_tokenizer(pair.get("target", "demo:target"))
    prompts = rendered(items, tokenizer, tuned["rendering"], tuned["max_prompt_tokens"])
    bench = pd.read_parquet(args.bench_dir / "requests.parquet")
    bench = bench[bench.candidate == args.candidate].groupby("prompt_id")[["draft_n", "accepted"]]
    in_bench = bench.mean()
    tools = build_llama_tools()
    rows = []
    for item, ids in prompts:
        with LlamaServer(tools, local_path(entry["target_gguf"]), setting) as server:
            c = server.complete(ids, int(tuned["n_predict"]))
        rows.append(
            {
                "prompt": item.id,
                "alone: drafted": c.draft_n,
                "alone: accepted": c.draft_n_accepted,
                "in the bench: drafted": in_bench.loc[item.id, "draft_n"],
                "in the bench: accepted": in_bench.loc[item.id, "accepted"],
            }
        )
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False, floatfmt=".1f"))
    for where in ("alone", "in the bench"):
        print(f"{where}: {(table[f'{where}: drafted'] > 0).sum()} of {len(table)} prompts drafted")


if __name__ == "__main__":
    main()
