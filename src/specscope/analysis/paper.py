"""The paper's published figures (Tables I-VI), shipped as data, and its E[L] formula.

``specscope/data/paper_tables.json`` is transcribed from the paper's tables; this module reads it
into the same :class:`PaperTables` a run's analysis produces (figures without intervals), so that
one comparison code path serves run-vs-run and run-vs-paper.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache
from importlib import resources

from .results import (
    CorrelationRow,
    DepthRow,
    LengthRow,
    PaperTables,
    PositionRow,
    SummaryRow,
)
from .stats import Estimate, nan_estimate

PAPER = "paper"


def expected_length(depth_means: Sequence[float]) -> tuple[tuple[float, ...], float]:
    """The paper's Eq. 3: cumulative products of per-depth means (Table III) and their sum (II)."""
    cumulative, product = [], 1.0
    for mean in depth_means:
        product *= mean
        cumulative.append(product)
    return tuple(cumulative), math.fsum(cumulative)


@cache
def paper_data() -> dict:
    """The raw transcription (a fresh parse is cached; treat it as read-only)."""
    text = resources.files("specscope").joinpath("data/paper_tables.json").read_text()
    return json.loads(text)


def _e(value: float | None, n: int = 0) -> Estimate:
    return nan_estimate() if value is None else Estimate(float(value), n=n)


def load_paper_tables() -> PaperTables:
    """The paper's Tables I-VI as a :class:`PaperTables` (source "paper", no intervals)."""
    data = paper_data()
    t1 = data["table1"]["rows"]
    table1 = tuple(
        SummaryRow(
            d,
            r["nodes"],
            _e(r["alpha_mean"], r["nodes"]),
            _e(r["alpha_std"], r["nodes"]),
            _e(r["target_entropy_mean"]),
        )
        for d, r in t1.items()
    )
    table2 = tuple(
        LengthRow(d, _e(r["expected_length"])) for d, r in sorted(data["table2"]["rows"].items())
    )
    table3 = tuple(
        DepthRow(d, tuple(_e(v) for v in vals))
        for d, vals in sorted(data["table3"]["rows"].items())
    )
    table4 = tuple(
        DepthRow(d, tuple(_e(v) for v in r["by_depth"]), _e(r["delta"]))
        for d, r in sorted(data["table4"]["rows"].items())
    )
    table5 = tuple(
        PositionRow(d, int(depth), tuple(_e(v) for v in r["by_bin"]), _e(r["delta"]))
        for d, block in data["table5"]["rows"].items()
        for depth, r in sorted(block.items())
    )
    table6 = tuple(
        CorrelationRow(
            d, t1.get(d, {}).get("nodes", 0), _e(r.get("spearman")), _e(r.get("pearson"))
        )
        for d, r in sorted(data["table6"]["rows"].items())
    )
    depth = data["tree"]["max_depth"]
    return PaperTables(
        PAPER,
        data["metric"],
        tuple(range(1, depth + 1)),
        (0, 1),
        table1,
        table2,
        table3,
        table4,
        table5,
        table6,
    )
