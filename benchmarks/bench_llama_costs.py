"""llama.cpp's pass-cost curves per setting, in its own loop (llama-bench), and the break-even table.

    python benchmarks/bench_llama_costs.py --out results/demo-pair/llama-costs [--quick]
    python benchmarks/bench_llama_costs.py --out DIR --grid DIR/cost_grid.json   # the tables again

For the demo pair's target (as shipped, Q4_K_M, and requantised with llama-quantize to Q4_0 and
Q8_0) and draft, llama-bench times a pass of 1..8 tokens after 192 tokens of context for every
combination of threads (1, 2), polling (0, 50) and batch / micro-batch size (2048/512, 512/128);
the draft with 1 and 2 threads. Writes ``cost_grid.json``, ``pass_costs.png`` and ``costs.md`` (the
curves, and per setting and K the tokens per step that speculation needs to pay). ``--quick``:
threads 2, polls 0 and 50, Q4_K_M only, 2 repetitions (a smoke test, not figures). ``--grid``: the
tables and the plot again from a grid measured before, nothing timed. Run it on an otherwise idle
machine: the full grid is 2 x 2 x 2 settings x 8 pass sizes x 5 repetitions per
target GGUF (3) plus the draft's, about 25 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from specscope.files import write_json, write_output
from specscope.models.demo import demo_gguf
from specscope.serving.llamacpp.costs import (
    CostGrid,
    GridOptions,
    break_even_rows,
    measure_grid,
    plot_cost_curves,
)
from specscope.serving.llamacpp.programs import build_llama_tools

FULL = GridOptions(
    threads=(1, 2),
    polls=(0, 50),
    draft_threads=(1, 2),
    batches=((2048, 512), (512, 128)),
    quants=("Q4_K_M", "Q4_0", "Q8_0"),
    tokens=8,
    depth=192,
    repetitions=5,
)
QUICK = GridOptions(
    threads=(2,),
    polls=(0, 50),
    draft_threads=(2,),
    batches=((2048, 512),),
    quants=("Q4_K_M",),
    tokens=8,
    depth=192,
    repetitions=2,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--depth", type=int, default=192)
    parser.add_argument("--repetitions", type=int, help="llama-bench repetitions per pass size")
    parser.add_argument("--grid", type=Path, help="a cost_grid.json measured before: no timing")
    args = parser.parse_args()
    if args.grid:
        grid = CostGrid.load(args.grid)
    else:
        opts = QUICK if args.quick else FULL
        opts = replace(opts, depth=args.depth, repetitions=args.repetitions or opts.repetitions)
        grid = measure_grid(
            build_llama_tools(), demo_gguf("target"), demo_gguf("draft"), opts, print
        )
        write_json(args.out / "cost_grid.json", grid.to_dict())
    plot_cost_curves(grid, args.out / "pass_costs.png")
    text = (
        "# llama.cpp pass costs (llama-bench)\n\n"
        + grid.curve_table().to_markdown(index=False, floatfmt=".2f")
        + "\n\n# Break-even tokens per step\n\n"
        + pd.DataFrame(break_even_rows(grid.candidates(), (1, 2, 3, 4, 5, 6, 7))).to_markdown(
            index=False, floatfmt=".2f"
        )
        + "\n"
    )
    write_output(args.out / "costs.md", text)
    print(text)


if __name__ == "__main__":
    main()
