"""Checks on read: every record column within its range, keys unique, certificates within their
bounds; a run that fails is refused with the column and the rows named.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .schema import TABLES, Run, RunDirError

# --- checks on read ---------------------------------------------------------------------------------

UNIT = (0.0, 1.0 + 1e-6)  # probabilities, with room for float rounding
NONNEGATIVE = (0.0, math.inf)
MAX_NATS = 17.0  # log of 2^24 tokens: no entropy or certificate of a real vocabulary exceeds it
RANGES = {
    "nodes": {
        "alpha": UNIT,
        "p_draft": UNIT,
        "p_target": UNIT,
        "target_top1_prob": UNIT,
        "target_margin": UNIT,
        "target_entropy": (0.0, MAX_NATS),
        "draft_entropy": (0.0, MAX_NATS),
        "kl_target_draft": (-1e-6, math.inf),
        "step": NONNEGATIVE,
        "node_id": NONNEGATIVE,
        "parent_id": (-1, math.inf),
        "depth": (1, math.inf),
        "sibling_rank": NONNEGATIVE,
        "target_rank": NONNEGATIVE,
        "token_id": NONNEGATIVE,
    },
    "steps": {
        "step": NONNEGATIVE,
        "context_len": (1, math.inf),
        "tree_size": NONNEGATIVE,
        "accepted_len": NONNEGATIVE,
        "tau": (1, math.inf),
        "emitted_token": NONNEGATIVE,
        "draft_time_s": NONNEGATIVE,
        "verify_time_s": NONNEGATIVE,
        "step_time_s": NONNEGATIVE,
    },
    "prompts": {"prompt_tokens": NONNEGATIVE, "generated_tokens": NONNEGATIVE},
}
KEYS = {
    "nodes": ("run_id", "prompt_id", "domain", "step", "node_id"),
    "steps": ("run_id", "prompt_id", "domain", "step"),
    "prompts": ("run_id", "prompt_id", "domain"),
}


def certificate_bound(column: str) -> float:
    """The largest finite value a recorded certificate can take: log(m + 1) for tree coverage
    with m candidates, log 2 for strict greedy, else the log of any real vocabulary (infinity
    means the criterion rejects no drafter there)."""
    if column.startswith("cert_tree_m") and column[len("cert_tree_m") :].isdigit():
        return math.log(int(column[len("cert_tree_m") :]) + 1)
    return math.log(2) if column == "cert_greedy" else MAX_NATS


def check_records(run: Run) -> None:
    """Raise RunDirError naming the table, column and rows when records are damaged: row counts
    or prompt ids that disagree with the manifest, missing keys, values out of their range."""
    where = run.path
    counts = run.manifest.get("counts") or {}
    complete = run.manifest.get("status") == "complete"
    for name in TABLES:
        df = getattr(run, name)
        if complete and name in counts and len(df) != counts[name]:
            raise RunDirError(
                f"{where}: {name} records have {len(df)} rows, the manifest says {counts[name]}: "
                f"{name}.parquet is damaged; run the same `specscope run` command again to "
                f"rebuild it from parts/"
            )
        for key in KEYS[name]:
            if key in df and df[key].isna().any():
                raise RunDirError(
                    f"{where}: {int(df[key].isna().sum())} {name} rows have no "
                    f"{key}: the records are damaged"
                )
        ranges = dict(RANGES[name])
        ranges.update(
            {c: (0.0, certificate_bound(c) + 1e-6) for c in df.columns if c.startswith("cert_")}
        )
        for column, (lo, hi) in ranges.items():
            if column not in df or len(df) == 0:
                continue
            values = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=float)
            # NaN: no certificate or timing recorded; no KL for point-mass proposals (ngram)
            nullable = (
                column.startswith("cert_")
                or column.endswith("_time_s")
                or column == "kl_target_draft"
            )
            bad = ~((values >= lo) & (values <= hi))
            if nullable:
                bad &= ~np.isnan(values)
            if column.startswith("cert_"):
                bad &= values != math.inf  # nothing the criterion rejects: no finite certificate
            if bad.any():
                first = float(values[bad][0])
                raise RunDirError(
                    f"{where}: {int(bad.sum())} {name} rows have {column} outside "
                    f"[{lo:g}, {hi:g}] (e.g. {first!r}): the records are damaged"
                )
    ids = run.manifest.get("prompts", {}).get("ids")
    if ids is not None and len(run.prompts):
        unknown = set(run.prompts["prompt_id"]) - set(ids)
        if unknown:
            raise RunDirError(
                f"{where}: prompts {sorted(unknown)[:3]} are not in the manifest's "
                "prompt list: the records do not belong to this run"
            )
