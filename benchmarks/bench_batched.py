"""Batched measurement on the demo pair: nodes per second by batch size and dtype, in one process.

    python benchmarks/bench_batched.py [--per-domain 4] [--max-new-tokens 8] [--sizes 1 4 8 16]

Measures the same prompts (per domain from the offline sources, paper tree, chat template) with
every (dtype, batch size) and prints nodes per second, the ratio to today's default (batch 1,
bfloat16) and whether the records equal those of batch 1 at the same dtype: tokens, trees and
greedy acceptance exactly, probabilities within 1e-5 (float32, int8) or 1e-2 (bfloat16, whose
rounding differs with the batch). The model loads are not timed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from specscope.models import PairConfig, load_pair
from specscope.records import load_run
from specscope.run.config import PromptSpec, RunConfig
from specscope.run.study import run_study
from specscope.trees import TreeConfig

PAIRS = {"bfloat16": PairConfig(dtype="bfloat16"), "float32": PairConfig(dtype="float32"),
         "int8": PairConfig(dtype="float32", quantize="int8")}
TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-5, "int8": 1e-5}


def same_records(a, b, tol: float) -> bool:
    key = ["prompt_id", "step", "node_id"]
    na, nb = (r.nodes.sort_values(key).reset_index(drop=True) for r in (a, b))
    exact = ["token_id", "parent_id", "depth", "sibling_rank", "greedy_accept"]
    return (len(na) == len(nb) and (na[key + exact].values == nb[key + exact].values).all()
            and bool(np.allclose(na.p_target, nb.p_target, atol=tol, rtol=0))
            and bool(np.allclose(na.p_draft, nb.p_draft, atol=tol, rtol=0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-domain", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--dtypes", nargs="+", default=list(PAIRS))
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes:
            config = RunConfig(pair=PAIRS[dtype], tree=TreeConfig(policy="paper"),
                               prompts=PromptSpec(domains=("code", "math", "reasoning", "chat"),
                                                  per_domain=args.per_domain),
                               max_new_tokens=args.max_new_tokens)
            pair = load_pair(config.pair)
            reference = None
            for size in args.sizes:
                out = Path(tmp) / f"{dtype}-{size}"
                t0 = time.perf_counter()
                summary = run_study(config, out, progress=False, pair=pair, batch_size=size)
                wall = time.perf_counter() - t0
                run = load_run(out)
                reference = reference or run
                equal = same_records(reference, run, TOLERANCE[dtype])
                rows.append((dtype, size, summary.nodes, wall, summary.nodes / wall, equal))
                print(f"{dtype:>8} B={size:<3} {summary.nodes} nodes in {wall:6.1f} s = "
                      f"{summary.nodes / wall:6.2f} nodes/s; records equal to B=1: {equal}",
                      flush=True)
            del pair
    base = next((r[4] for r in rows if r[0] == "bfloat16" and r[1] == 1), None)
    print("\n| dtype | batch | nodes | seconds | nodes/s | vs B=1 bf16 | records equal to B=1 |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for dtype, size, nodes, wall, rate, equal in rows:
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"| {dtype} | {size} | {nodes} | {wall:.1f} | {rate:.2f} | {ratio} | "
              f"{'yes' if equal else 'NO'} |")


if __name__ == "__main__":
    main()
