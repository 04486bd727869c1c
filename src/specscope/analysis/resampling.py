"""The state one analysis shares: the prompt-clustered bootstrap weights of the run, applied to
any node or step metric, so that every figure and every difference gets its interval from the
same resamples.

:class:`Resampler` holds the whole ``(B + 1) x prompts`` weight matrix (a measurement run has as
many prompts as were measured with a model). :func:`stratum_totals` gives the per-domain totals
of the same resamples in chunks, for runs of any number of prompts (an ingested engine log of
millions of requests): its memory does not grow with the number of prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .prepare import ALL, Records
from .results import (
    Settings,
)
from .stats import (
    ClusterBootstrap,
    Ranked,
    ratio,
)

CHUNK_WEIGHTS = 1 << 20  # bootstrap weights :func:`stratum_totals` holds at once (8 MiB)


@dataclass(frozen=True)
class Cells:
    """Bootstrap totals of a value over (domain + All, *shape) cells."""

    sums: np.ndarray  # (B + 1, G + 1, *shape)
    counts: np.ndarray  # (B + 1, G + 1, *shape)
    prompts: np.ndarray  # (G + 1, *shape): prompts with at least one observation in the cell
    strata: np.ndarray  # (G + 1, *shape): domains with at least one such prompt

    @property
    def mean(self) -> np.ndarray:
        return ratio(self.sums, self.counts)

    @property
    def n(self) -> np.ndarray:
        return self.counts[0].astype(np.int64)


class Resampler:
    """Shared state of one analysis: the records and one bootstrap weight matrix."""

    def __init__(self, records: Records, settings: Settings):
        self.rec = records
        self.settings = settings
        self.boot = ClusterBootstrap.draw(
            records.prompt_domain, settings.n_boot, settings.seed, settings.confidence
        )
        self.G = len(records.domains)
        self._ranked: dict[tuple[str, str], Ranked] = {}

    def ranked(self, group: str, name: str, values: np.ndarray) -> Ranked:
        """Ranks of a variable within a group, computed once per analysis."""
        key = (group, name)
        if key not in self._ranked:
            self._ranked[key] = Ranked.of(values, self.settings.rank_bins)
        return self._ranked[key]

    def cells(
        self,
        values: np.ndarray | None,
        keys: tuple = (),
        mask: np.ndarray | None = None,
        table: str = "nodes",
    ) -> Cells:
        """Totals of ``values`` (None: counts) per domain x keys; keys are (codes, size) pairs."""
        arrays = self.rec.nodes if table == "nodes" else self.rec.steps
        prompt, cell = arrays.prompt, arrays.domain
        sizes = tuple(size for _, size in keys)
        for codes, size in keys:
            cell = cell * size + codes
        if values is None:
            values = np.ones(len(prompt))
        if mask is not None:
            prompt, cell, values = prompt[mask], cell[mask], values[mask]
        n_cells = self.G * math.prod(sizes)
        P = self.rec.n_prompts
        index = prompt * n_cells + cell
        sums = np.bincount(index, weights=values, minlength=P * n_cells).reshape(P, n_cells)
        counts = np.bincount(index, minlength=P * n_cells).reshape(P, n_cells)
        shape = (self.G,) + sizes
        t_sums = self.boot.total(sums).reshape((-1,) + shape)
        t_counts = self.boot.total(counts).reshape((-1,) + shape)
        present = (counts > 0).reshape((P,) + shape)
        per_domain = present.sum(0)
        prompts = np.concatenate([per_domain, present.any(axis=1).sum(0)[None]], axis=0)
        strata = np.concatenate([np.minimum(per_domain, 1), (per_domain > 0).sum(0)[None]], axis=0)
        return Cells(
            np.concatenate([t_sums, t_sums.sum(axis=1, keepdims=True)], axis=1),
            np.concatenate([t_counts, t_counts.sum(axis=1, keepdims=True)], axis=1),
            prompts,
            strata,
        )

    def estimates(self, reps: np.ndarray, cells: Cells) -> np.ndarray:
        """Estimates of replicates shaped like ``cells`` (or like its leading dimensions)."""
        n, prompts, strata = cells.n, cells.prompts, cells.strata
        extra = reps.ndim - 1 - n.ndim
        if extra < 0:  # a reduction over trailing dims: sum counts, max prompts
            axes = tuple(range(reps.ndim - 1, n.ndim))
            n, prompts, strata = n.sum(axis=axes), prompts.max(axis=axes), strata.max(axis=axes)
        return self.boot.estimates(reps, n, prompts, strata)

    # Groups for correlations: each domain's nodes with its prompts' resamples (and its number of
    # strata, 1), then All.
    def groups(self):
        nodes = self.rec.nodes
        for g, label in enumerate(self.rec.domains):
            cols = np.flatnonzero(self.rec.prompt_domain == g)
            local = np.full(self.rec.n_prompts, -1)
            local[cols] = np.arange(len(cols))
            mask = nodes.domain == g
            yield label, mask, self.boot.subset(cols), local[nodes.prompt[mask]], 1
        yield ALL, np.ones(len(nodes), bool), self.boot, nodes.prompt, self.G


def depth_keys(rec: Records) -> tuple:
    return ((rec.nodes.depth - 1, rec.max_depth),)


@dataclass(frozen=True)
class StratumTotals:
    """Bootstrap totals of per-prompt values within each stratum (domain)."""

    strata: np.ndarray  # (G,) the strata, sorted
    totals: np.ndarray  # (B + 1, G, k): row 0 the plain sums, rows 1..B the resamples'
    varies: np.ndarray  # (G,) whether any resample drew the stratum's prompts other than once each


def stratum_totals(
    strata: np.ndarray, values: np.ndarray, n_boot: int, seed: int, max_weights: int | None = None
) -> StratumTotals:
    """Each stratum's totals of ``values`` (P, k) under the resamples of
    ``ClusterBootstrap.draw(strata, n_boot, seed)``: the same random stream (multinomial draws,
    stratum after stratum, each drawn row after row) and so the same figures, but drawn at most
    ``max_weights`` (default :data:`CHUNK_WEIGHTS`) weights at a time instead of as one
    ``(B + 1) x P`` matrix."""
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    max_weights = max_weights or CHUNK_WEIGHTS
    strata = np.asarray(strata)
    values = np.asarray(values, dtype=float).reshape(len(strata), -1)
    labels = np.unique(strata)  # sorted: the draw order is fixed by the seed alone
    totals = np.empty((n_boot + 1, len(labels), values.shape[1]))
    varies = np.zeros(len(labels), bool)
    rng = np.random.default_rng(seed)
    for g, stratum in enumerate(labels):
        cols = np.flatnonzero(strata == stratum)
        block = values[cols]
        totals[0, g] = np.ones(len(cols)) @ block
        rows = max(1, max_weights // len(cols))
        pvals = np.full(len(cols), 1.0 / len(cols))
        for start in range(1, n_boot + 1, rows):
            draws = rng.multinomial(len(cols), pvals, size=min(rows, n_boot + 1 - start))
            varies[g] |= bool(np.any(draws != 1))
            totals[start : start + len(draws), g] = draws.astype(float) @ block
    return StratumTotals(labels, totals, varies)
