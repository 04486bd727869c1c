"""Benchmark: analysis of about one million synthetic node rows with 1,000 bootstrap resamples.

    python benchmarks/bench_analysis.py [--prompts-per-domain 500] [--boot 1000] [--keep DIR]

Writes a synthetic run (4 domains x 500 prompts x 64 steps x 8 nodes = 1,024,000 node rows),
then times reading it and computing every table, metric, interval and finding (no plots, no
files): the work of ``specscope analyze --no-plots`` minus writing the outputs. Target: under
30 seconds on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from specscope.analysis import Settings, analyze_records, prepare, read_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/, in a checkout
from lab.synthetic import write_synthetic_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts-per-domain", type=int, default=500)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--boot", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.keep or Path(tmp) / "run"
        t0 = time.perf_counter()
        write_synthetic_run(
            run_dir,
            prompts_per_domain=args.prompts_per_domain,
            steps=args.steps,
            seed=args.seed,
            run_id="bench",
        )
        t1 = time.perf_counter()
        run = read_run(run_dir)
        t2 = time.perf_counter()
        records = prepare(run)
        t3 = time.perf_counter()
        analysis = analyze_records(records, Settings(n_boot=args.boot, seed=args.seed))
        t4 = time.perf_counter()

    rows = len(records.nodes)
    total = t4 - t1
    print(f"cpu cores available: {len(os.sched_getaffinity(0))}")
    print(
        f"synthetic run: {rows:,} node rows, {len(records.steps):,} steps, "
        f"{records.n_prompts:,} prompts (written in {t1 - t0:.1f} s, not timed)"
    )
    print(
        f"read {t2 - t1:.2f} s | prepare {t3 - t2:.2f} s | "
        f"tables + {args.boot} bootstrap resamples {t4 - t3:.2f} s"
    )
    print(
        f"total {total:.2f} s, {rows / total:,.0f} node rows/s; "
        f"{len(analysis.findings)} findings checked"
    )


if __name__ == "__main__":
    main()
