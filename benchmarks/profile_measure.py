"""Where measurement's time goes on the demo pair: one run under cProfile, for one dtype and batch.

    python benchmarks/profile_measure.py bfloat16|float32|int8 [--batch 8] [--max-new-tokens 16]
                                         [--threads N]

Loads the demo pair (the load timed apart), measures 2 offline prompts per domain with the paper
tree at the given batch size, and prints nodes per second and the functions with the most time
of their own. Run one process per dtype, on an otherwise idle machine. ``--threads`` sets torch's
threads (more than the cores: what a container with a CPU quota on a larger host gets by default).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import torch

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dtype", choices=list(PAIRS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=18, help="functions listed")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    pair = load_pair(PAIRS[args.dtype])
    print(f"load {time.perf_counter() - t0:.1f} s, {torch.get_num_threads()} torch threads")
    config = RunConfig(
        pair=PAIRS[args.dtype],
        prompts=PromptSpec(domains=("code", "math", "reasoning", "chat"), per_domain=2),
        tree=TreeConfig(policy="paper"),
        max_new_tokens=args.max_new_tokens,
    )
    with tempfile.TemporaryDirectory() as out:
        profile = cProfile.Profile()
        t0 = time.perf_counter()
        profile.enable()
        run_study(config, Path(out) / "run", progress=False, batch_size=args.batch, pair=pair)
        profile.disable()
        wall = time.perf_counter() - t0
        nodes = len(load_run(Path(out) / "run").nodes)
    print(
        f"{args.dtype} batch {args.batch}: {nodes} nodes in {wall:.1f} s = {nodes / wall:.1f} nodes/s"
    )
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
