"""Batched measurement on the demo pair: nodes per second by batch size and dtype, in one process.

    python benchmarks/bench_batched.py [--per-domain 4] [--max-new-tokens 8] [--sizes 1 4 8 16]
                                       [--rounds 1]

Measures the same prompts (per domain from the offline sources, paper tree, chat template) with
every (dtype, batch size) and prints nodes per second, the ratio to today's default (batch 1,
bfloat16) and whether the records equal those of batch 1 at the same dtype: tokens, trees and
greedy acceptance exactly, probabilities within 1e-5 (float32, int8) or 1e-2 (bfloat16, whose
rounding differs with the batch). The model loads and the first read of the prompt sources are
not timed. With ``--rounds`` > 1 every cell runs once per round, in the reverse order every other
round, and each ratio is taken within a round (a shared machine's speed drifts over minutes): the
table shows the median seconds and the median ratio [min, max] over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from specscope.models import PairConfig, load_pair
from specscope.records import load_run
from specscope.run.config import PromptSpec, RunConfig
from specscope.run.study import run_study
from specscope.trees import TreeConfig

PAIRS = {
    "bfloat16": PairConfig(dtype="bfloat16"),
    "float32": PairConfig(dtype="float32"),
    "int8": PairConfig(dtype="float32", quantize="int8"),
}
TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-5, "int8": 1e-5}


def same_records(a, b, tol: float) -> bool:
    key = ["prompt_id", "step", "node_id"]
    na, nb = (r.nodes.sort_values(key).reset_index(drop=True) for r in (a, b))
    exact = ["token_id", "parent_id", "depth", "sibling_rank", "greedy_accept"]
    return (
        len(na) == len(nb)
        and (na[key + exact].values == nb[key + exact].values).all()
        and bool(np.allclose(na.p_target, nb.p_target, atol=tol, rtol=0))
        and bool(np.allclose(na.p_draft, nb.p_draft, atol=tol, rtol=0))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-domain", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--dtypes", nargs="+", default=list(PAIRS))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    configs = {
        dtype: RunConfig(
            pair=PAIRS[dtype],
            tree=TreeConfig(policy="paper"),
            prompts=PromptSpec(
                domains=("code", "math", "reasoning", "chat"), per_domain=args.per_domain
            ),
            max_new_tokens=args.max_new_tokens,
        )
        for dtype in args.dtypes
    }
    first = next(iter(configs.values()))
    first.prompts.select(first.seed)  # the prompt sources' first read, untimed
    pairs = {dtype: load_pair(config.pair) for dtype, config in configs.items()}
    cells = [(dtype, size) for dtype in args.dtypes for size in args.sizes]
    walls: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
    nodes: dict[tuple[str, int], int] = {}
    equal: dict[tuple[str, int], bool] = {}
    references = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for dtype, size in cells if round_ % 2 == 0 else cells[::-1]:
                out = Path(tmp) / f"{dtype}-{size}-{round_}"
                t0 = time.perf_counter()
                summary = run_study(
                    configs[dtype], out, progress=False, pair=pairs[dtype], batch_size=size
                )
                wall = time.perf_counter() - t0
                run = load_run(out)
                reference = (
                    references.setdefault(dtype, run) if size == 1 else references.get(dtype)
                )
                same = reference is None or same_records(reference, run, TOLERANCE[dtype])
                walls[dtype, size].append(wall)
                nodes[dtype, size] = summary.nodes
                equal[dtype, size] = equal.get((dtype, size), True) and same
                print(
                    f"round {round_ + 1}: {dtype:>8} B={size:<3} {summary.nodes} nodes in "
                    f"{wall:6.1f} s = {summary.nodes / wall:6.2f} nodes/s; records equal to "
                    f"B=1: {same}",
                    flush=True,
                )
    base = walls.get(("bfloat16", 1))
    print("\n| dtype | batch | nodes | seconds | nodes/s | vs B=1 bf16 | records equal to B=1 |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for cell in cells:
        wall = statistics.median(walls[cell])
        ratio = "-"
        if base:
            ratios = [
                (b / nodes["bfloat16", 1]) / (w / nodes[cell]) for b, w in zip(base, walls[cell])
            ]
            ratio = f"{statistics.median(ratios):.2f}x"
            if len(ratios) > 1:
                ratio += f" [{min(ratios):.2f}, {max(ratios):.2f}]"
        print(
            f"| {cell[0]} | {cell[1]} | {nodes[cell]} | {wall:.1f} | {nodes[cell] / wall:.2f} "
            f"| {ratio} | {'yes' if equal[cell] else 'NO'} |"
        )


if __name__ == "__main__":
    main()
