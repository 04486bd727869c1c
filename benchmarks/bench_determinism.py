"""Do two runs of one config write the same records? Two plain runs, one run instrumented as
``bench_roofline.py`` instruments it, and one at batch 1, compared column by column.

    python benchmarks/bench_determinism.py --pair random --device cuda \\
        --prompts benchmarks/data/prompts-2-per-domain.jsonl [--deterministic]

Without ``--deterministic`` the pair runs on torch's default kernels (a random pair is built
without ``load_pair``, which would turn deterministic kernels on); with it, on the settings
``load_pair`` makes (:func:`specscope.models.load.reproducible_on`). Prints, for each pair of runs
and each record table, the columns that differ (timings aside). On an H100 the default kernels
gave differing records between two plain runs, the deterministic ones none (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_roofline as roofline  # noqa: E402  (the pairs and timed runs of the roofline bench)

from specscope.models.load import reproducible_on  # noqa: E402
from specscope.records import TIMING_COLUMNS, load_run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/, in a checkout
from lab.stages_timing import clock_for, instrumented  # noqa: E402


def differing_columns(a: Path, b: Path) -> dict[str, list[str] | str]:
    """Per record table, the columns (timings aside) whose values differ between two runs."""
    ra, rb = load_run(a), load_run(b)
    out: dict[str, list[str] | str] = {}
    for table in ("nodes", "steps", "prompts"):
        ta, tb = getattr(ra, table), getattr(rb, table)
        if ta.shape != tb.shape:
            out[table] = f"shapes differ: {ta.shape} against {tb.shape}"
            continue
        out[table] = [c for c in ta.columns if c not in TIMING_COLUMNS and not ta[c].equals(tb[c])]
    return out


def main(argv: list[str] | None = None) -> dict[tuple[str, str], dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=roofline.PAIR_KINDS, default="random")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--prompts", help="a JSONL prompts file instead of the offline sources")
    parser.add_argument("--per-domain", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--paths", help="a static tree's paths instead of the paper tree")
    parser.add_argument("--deterministic", action="store_true", help="as load_pair sets a GPU")
    args = parser.parse_args(argv)
    config = roofline.pair_config(args.pair, args.dtype, args.device)
    if args.deterministic:
        reproducible_on(args.device)
    pair = roofline.build_pair(args.pair, config)
    run = roofline.run_config(args, config)
    clock = clock_for(pair.target.device)
    results = {}
    with tempfile.TemporaryDirectory(prefix="determinism-") as tmp:
        work = Path(tmp)
        for name in ("plain-a", "plain-b"):
            roofline.timed_run(run, work / name, pair, args.batch_size, clock)
        with instrumented(roofline.pair_models(pair), clock):
            roofline.timed_run(run, work / "instrumented", pair, args.batch_size, clock)
        roofline.timed_run(run, work / "batch-1", pair, 1, clock)
        for other in ("plain-b", "instrumented", "batch-1"):
            results["plain-a", other] = diff = differing_columns(work / "plain-a", work / other)
            for table, columns in diff.items():
                print(f"plain-a against {other}, {table}: differing columns {columns or 'none'}")
    return results


if __name__ == "__main__":
    main()
