"""How often a held-out tokens-per-step figure falls in its prediction's interval, on shipped
measurement runs and on synthetic prompts of known truth.

A bench checks tune's predicted tokens per step on held-out prompts. Both the tuning prompts and
the held-out ones are samples of one population, so the check's interval must hold both samples'
variation (``specscope.analysis.stats.held_out_interval``), not only the tuning mean's. This
script measures, for each interval, how often the held-out figure falls in it:

- synthetic prompts (a chain of 4, prompt effects; ``decoding_prompts``): fresh samples of a
  population whose truth is the same for both;
- each domain of shipped runs: the run's prompts split at random into tuning and held-out
  prompts (exchangeable by construction), replaying the top-1 chain of ``--depth`` and the
  run's own tree as greedy decoding.

    python scripts/held_out_calibration.py results/demo-pair/paper-protocol \
        results/demo-pair/drafters-bf16-full/draft-model --trials 2000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from specscope.analysis.replay import (
    MeasuredTree,
    index_records,
    replay_counts,
    top_chain,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/, in a checkout
from lab.calibration import held_out_coverage  # noqa: E402


def synthetic(trials: int, splits: list[tuple[int, int]]) -> pd.DataFrame:
    rows = []
    for fitted, held in splits:
        cover = held_out_coverage(fitted, held, trials=trials, seed=1)
        rows.append({"source": "synthetic", "tuning": fitted, "held out": held, **cover})
    return pd.DataFrame(rows)


def measured(run: str, depth: int, trials: int, held_share: float) -> pd.DataFrame:
    rec = index_records(run)
    candidates = {"measured tree": MeasuredTree()}
    if rec.spine_depth:
        chain = min(depth, rec.spine_depth)
        candidates[f"chain of {chain}"] = top_chain(chain)
    rows, seen = [], []
    for label, candidate in candidates.items():
        per_prompt = replay_counts(rec, candidate, prefill_drafts=False).per_prompt()[:, :2]
        if any(np.array_equal(per_prompt, other) for other in seen):
            continue  # the run's tree is that chain
        seen.append(per_prompt)
        for code, domain in enumerate(rec.domains):
            pool = per_prompt[rec.prompt_domain == code]
            held = max(2, round(len(pool) * held_share))
            fitted = len(pool) - held
            cover = held_out_coverage(fitted, held, trials=trials, seed=code, population=pool)
            rows.append(
                {
                    "source": f"{run}: {label}",
                    "domain": domain,
                    "tuning": fitted,
                    "held out": held,
                    **cover,
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="measurement run directories")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--depth", type=int, default=4, help="the top-1 chain replayed")
    parser.add_argument("--held-share", type=float, default=0.4, help="held-out share of a pool")
    args = parser.parse_args()
    tables = [synthetic(args.trials, [(10, 10), (10, 20), (30, 20), (30, 30), (60, 20)])]
    tables += [measured(run, args.depth, args.trials, args.held_share) for run in args.runs]
    table = pd.concat(tables, ignore_index=True).fillna({"domain": "-"})
    order = ["source", "domain", "tuning", "held out", "tuning interval", "held-out interval"]
    table = table[order]
    print(
        f"Share of {args.trials} random splits whose held-out tokens per step falls in the "
        "tuning prompts' 95% interval, and in that interval widened for the held-out sample:\n"
    )
    print(table.to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
