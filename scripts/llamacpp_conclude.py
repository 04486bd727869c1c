"""Conclude a llama-server bench again from its own requests: the tables, regret, routed against
the best single setting and the precision verdicts of ``bench.json`` and ``summary.md``, from
``requests.parquet`` (after a change to how they are concluded), with ``--more-repeats N`` more
repeats of every request timed first (each on fresh servers, as the bench's own).

    python scripts/llamacpp_conclude.py results/demo-pair/llamacpp --per-domain 20
    python scripts/llamacpp_conclude.py results/demo-pair/llamacpp --per-domain 20 --more-repeats 1

The policy, prompts and candidates are the bench's own (same --per-domain and --seed).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from specscope.serving.llamacpp.backend import requests_from_frame
from specscope.serving.llamacpp.study import llama_server_plan
from specscope.tune import study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_dir", type=Path)
    parser.add_argument("--per-domain", type=int, required=True)
    parser.add_argument("--more-repeats", type=int, default=0)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    requests = requests_from_frame(pd.read_parquet(args.bench_dir / "requests.parquet"))
    plan = llama_server_plan(
        args.bench_dir / "policy.json",
        args.bench_dir,
        ["code", "math", "reasoning", "chat"],
        args.per_domain,
        args.more_repeats,
        args.max_new_tokens,
        args.seed,
        earlier=requests,
    )
    bench = study.bench(plan)
    study.save(plan, bench, args.bench_dir)
    single = bench.document["routed_vs_best_single"]
    print((args.bench_dir / "summary.md").read_text())
    print(single)


if __name__ == "__main__":
    main()
