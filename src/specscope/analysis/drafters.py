"""Drafters side by side on the same prompts: tokens per target pass, greedy acceptance by depth,
the share of steps with a proposal, and a paired verdict on "drafter A accepts more than B".

A run holds one drafter's records: its ``drafter`` column is the drafter's label (``draft-model``,
``ngram(prompt_lookup_min=5, prompt_lookup_max=5)``, ``early-exit(exit_layer=8)``; records older
than the column read as ``draft-model``). Runs of several drafters over the same prompts with the
same target are compared prompt by prompt: greedy verification makes every drafter follow the
target's own greedy output, so a prompt's steps are the same contexts whichever drafter proposed.
Only the prompts that every run measured are compared.

Per drafter and domain (and all domains, "All"), with prompt-clustered intervals:

- ``tau``: tokens per target pass, ``accepted_len + 1`` averaged over steps (docs/metrics.md); a
  step without a proposal (a lookup that found no match) counts 1;
- the share of steps with a proposal (``tree_size > 0``): 1 for a drafter that runs a model;
- greedy acceptance by depth along the top-1 chain, ``P(greedy_accept | parent accepted)`` over
  rank-0 nodes whose parent path is accepted: a chain drafter's whole proposal, a tree's top-1
  path, so chains and trees are compared node for node.

One bootstrap (:class:`.stats.ClusterBootstrap`, prompts resampled within domains) is drawn over
the shared prompts and applied to every drafter's per-prompt sums: a resampled prompt brings all
drafters' steps with it, so the difference of two drafters' tau gets a paired interval. The
verdict on "A accepts more than B in domain D" is the findings' rule for one figure
(:func:`.findings.one_sided_verdict`) applied to ``tau_A − tau_B``: holds if it is significantly
above 0, does not hold if significantly below, inconclusive otherwise, and not testable with fewer
than ``Settings.min_prompts`` shared prompts in the domain (in every domain, for "All"). Its error
rates are measured on synthetic drafters of known tau (:func:`lab.calibration.drafter_verdict_rates`,
docs/calibration.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SpecscopeError
from ..records import Run
from ..records.schema import FILLED_COLUMNS
from .findings import Verdict, one_sided_verdict
from .prepare import ALL, prepare, read_run
from .replay import MeasuredTree, index_records, replay_counts
from .results import Settings
from .stats import ClusterBootstrap, DomainCells, Estimate, bounded

DEFAULT_DRAFTER = FILLED_COLUMNS["drafter"]  # what records without a drafter column were


class DrafterComparisonError(SpecscopeError, ValueError):
    """Runs that cannot be compared drafter by drafter: no shared prompts, or a prompt whose domain
    or text differs between the runs."""


@dataclass(frozen=True)
class DrafterRow:
    """One drafter in one domain (or All) over the shared prompts."""

    drafter: str
    domain: str
    prompts: int
    steps: int
    tau: Estimate  # mean accepted_len + 1 over steps (the position mean)
    decoded: Estimate  # decoded tokens per step: the run's trees replayed as greedy decoding
    proposal_share: Estimate  # share of steps with at least one proposed token
    chain_acceptance: tuple[Estimate, ...]  # greedy | parent accepted, top-1 chain, per depth


@dataclass(frozen=True)
class DrafterVerdict:
    """The verdict on "``drafter`` accepts more than ``other``" in one domain (or All)."""

    domain: str
    drafter: str
    other: str
    difference: Estimate  # tau of drafter − tau of other, paired by prompt
    verdict: Verdict
    detail: str

    @property
    def claim(self) -> str:
        return f"{self.drafter} accepts more than {self.other}"


@dataclass(frozen=True)
class DrafterComparison:
    """Several drafters measured on the same prompts: one row per drafter and domain, and one
    verdict per pair of drafters (in the order given) and domain."""

    drafters: tuple[str, ...]
    run_ids: tuple[str, ...]  # the run of each drafter, same order
    domains: tuple[str, ...]
    domain_prompts: tuple[int, ...]  # shared prompts per domain
    depths: tuple[int, ...]
    rows: tuple[DrafterRow, ...]
    verdicts: tuple[DrafterVerdict, ...]
    settings: Settings
    warnings: tuple[str, ...] = ()

    def row(self, drafter: str, domain: str) -> DrafterRow | None:
        return next((r for r in self.rows if (r.drafter, r.domain) == (drafter, domain)), None)

    def verdict(self, drafter: str, other: str, domain: str) -> DrafterVerdict | None:
        return next(
            (
                v
                for v in self.verdicts
                if (v.drafter, v.other, v.domain) == (drafter, other, domain)
            ),
            None,
        )


def run_drafter(run: Run) -> str:
    """The drafter that proposed a run's trees (``draft-model`` for records that name none)."""
    labels: set[str] = set()
    for frame in (run.steps, run.nodes):
        if "drafter" in frame and len(frame):
            column = frame["drafter"]
            labels |= {str(x) for x in column.dropna().unique()}
            if column.isna().any():
                labels.add(DEFAULT_DRAFTER)
    if len(labels) > 1:
        raise DrafterComparisonError(
            f"{run.path}: the records name several drafters ({', '.join(sorted(labels))}); "
            "a run measures one"
        )
    return labels.pop() if labels else DEFAULT_DRAFTER


def _labels(runs: Sequence[Run]) -> tuple[str, ...]:
    """Each run's drafter; a drafter given twice is told apart by its run id."""
    names = [run_drafter(r) for r in runs]
    out: list[str] = []
    for run, name in zip(runs, names):
        label = name if names.count(name) == 1 else f"{name} [{run.manifest.get('run_id')}]"
        while label in out:
            label += "'"
        out.append(label)
    return tuple(out)


def _prompt_domains(runs: Sequence[Run], labels: Sequence[str]) -> tuple[pd.Series, list[str]]:
    """The prompts every run measured, with their domain (sorted by prompt id), and warnings."""
    measured = []
    for run in runs:
        steps = run.steps[["prompt_id", "domain"]].drop_duplicates("prompt_id").astype(str)
        measured.append(steps.set_index("prompt_id")["domain"])
    shared = sorted(set.intersection(*(set(m.index) for m in measured)))
    if not shared:
        raise DrafterComparisonError(
            "the runs share no prompt: compare drafters measured on the same prompts "
            f"({', '.join(labels)})"
        )
    domain = measured[0].loc[shared]
    texts = None
    for run, label, m in zip(runs, labels, measured):
        differ = m.loc[shared] != domain
        if differ.any():
            p = differ.idxmax()
            raise DrafterComparisonError(
                f"prompt {p!r} is in domain {domain[p]!r} in the run of {labels[0]} and in "
                f"{m[p]!r} in the run of {label}: not the same prompts"
            )
        prompts = run.prompts.dropna(subset=["prompt_text"]).drop_duplicates("prompt_id")
        text = prompts.set_index("prompt_id")["prompt_text"].reindex(shared)
        if texts is not None:
            both = text.notna() & texts.notna()
            differ = both & (text != texts)
            if differ.any():
                raise DrafterComparisonError(
                    f"prompt {differ.idxmax()!r} has another text in the run of {label} than in "
                    f"the run of {labels[0]}: not the same prompts (another rendering or "
                    "tokenizer?)"
                )
        texts = text if texts is None else texts.fillna(text)
    warnings = []
    left = sorted(set().union(*(set(m.index) for m in measured)) - set(shared))
    if left:
        warnings.append(
            f"{len(left)} prompts measured by only some of the runs are left out "
            f"(e.g. {', '.join(left[:3])}); {len(shared)} prompts are compared"
        )
    targets = {str((r.manifest.get("config") or {}).get("pair", {}).get("target")) for r in runs}
    if len(targets - {"None"}) > 1:
        warnings.append(
            f"the runs name different targets ({', '.join(sorted(targets))}): a difference in "
            "tau is then not the drafters' alone"
        )
    return domain, warnings


def _per_prompt(run: Run, index: pd.Index, depth: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """(P, 5 + 2 depth) sums per shared prompt, in the columns of :class:`_Block`; and the
    records' warnings."""
    P = len(index)
    steps = run.steps
    at = index.get_indexer(steps["prompt_id"].astype(str))
    keep = at >= 0
    counts = np.bincount(at[keep], minlength=P)
    tau = np.bincount(at[keep], weights=steps["tau"].to_numpy(float)[keep], minlength=P)
    proposed = steps["tree_size"].to_numpy(float)[keep] > 0
    proposals = np.bincount(at[keep], weights=proposed, minlength=P)
    chain = np.zeros((P, depth))
    accepted = np.zeros((P, depth))
    warnings: tuple[str, ...] = ()
    if len(run.nodes):  # a lookup that never matched proposes no node at all
        rec = prepare(run)
        nodes = rec.nodes
        node_at = index.get_indexer(list(rec.prompt_ids))[nodes.prompt]
        mask = (node_at >= 0) & nodes.on_chain & nodes.eligible
        cell = node_at[mask] * depth + nodes.depth[mask] - 1
        chain = np.bincount(cell, minlength=P * depth).reshape(P, depth)
        accepted = np.bincount(cell, weights=nodes.greedy[mask], minlength=P * depth)
        accepted = accepted.reshape(P, depth)
        warnings = rec.warnings
    replayed = index_records(run)
    decoded = replay_counts(replayed, MeasuredTree())
    replay_at = index.get_indexer(list(replayed.prompt_ids))
    found = replay_at >= 0
    positions, decoding_steps = np.zeros(P), np.zeros(P)
    positions[replay_at[found]] = decoded.positions[found]
    decoding_steps[replay_at[found]] = decoded.steps[found]
    columns = [
        counts[:, None],
        tau[:, None],
        proposals[:, None],
        positions[:, None],
        decoding_steps[:, None],
        chain,
        accepted,
    ]
    return np.hstack(columns).astype(float), warnings


@dataclass(frozen=True)
class _Block:
    """Where one drafter's sums lie among the columns: steps, tau, steps with a proposal, output
    tokens and decoding steps of the replay, then eligible top-1-chain nodes and the accepted
    ones, one column per depth each."""

    start: int
    depth: int

    @property
    def width(self) -> int:
        return 5 + 2 * self.depth

    def col(self, offset: int, size: int = 1) -> slice:
        return slice(self.start + offset, self.start + offset + size)

    @property
    def steps(self) -> slice:
        return self.col(0)

    @property
    def tau(self) -> slice:
        return self.col(1)

    @property
    def proposed(self) -> slice:
        return self.col(2)

    @property
    def positions(self) -> slice:
        return self.col(3)

    @property
    def decoding_steps(self) -> slice:
        return self.col(4)

    @property
    def chain(self) -> slice:
        return self.col(5, self.depth)

    @property
    def accepted(self) -> slice:
        return self.col(5 + self.depth, self.depth)


def compare_drafters(
    runs: Sequence[Run | str | Path], settings: Settings | None = None
) -> DrafterComparison:
    """Every drafter's tau, proposal share and top-1-chain acceptance per domain, and a verdict
    on each pair of drafters (the earlier run's drafter named first) in each domain and overall.

    ``runs``: one run per drafter (:class:`~specscope.records.Run`, or a run directory), measured
    on the same prompts. Raises DrafterComparisonError when the runs share no prompt, or a shared
    prompt's domain or text differs between them.
    """
    settings = Settings() if settings is None else settings
    runs = [r if isinstance(r, Run) else read_run(r) for r in runs]
    if not runs:
        raise DrafterComparisonError("no run to compare")
    labels = _labels(runs)
    prompt_domain, warnings = _prompt_domains(runs, labels)
    domains = tuple(sorted(set(prompt_domain)))
    codes = pd.Index(domains).get_indexer(prompt_domain.to_numpy())
    depth = max([int(r.nodes["depth"].max()) for r in runs if len(r.nodes)] or [1])

    sums, blocks = [], []
    for k, (run, label) in enumerate(zip(runs, labels)):
        x, notes = _per_prompt(run, pd.Index(prompt_domain.index), depth)
        sums.append(x)
        blocks.append(_Block(k * x.shape[1], depth))
        warnings += [f"{label}: {w}" for w in notes]
    boot = ClusterBootstrap.draw(codes, settings.n_boot, settings.seed, settings.confidence)
    cells = DomainCells.of(boot, np.hstack(sums), codes)

    scopes = domains + (ALL,)
    rows = [row for label, b in zip(labels, blocks) for row in _rows(cells, label, b, scopes)]
    counts = dict(zip(domains, np.bincount(codes, minlength=len(domains)).tolist()))
    verdicts = []
    for i, j in combinations(range(len(runs)), 2):
        a, b = blocks[i], blocks[j]
        diff = cells.mean(a.tau, a.steps) - cells.mean(b.tau, b.steps)  # paired: same resamples
        estimates = cells.estimates(diff, a.steps)
        for g, scope in enumerate(scopes):
            verdicts.append(
                _verdict(labels[i], labels[j], scope, estimates[g, 0], counts, settings)
            )
    return DrafterComparison(
        labels,
        tuple(str(r.manifest.get("run_id", r.path)) for r in runs),
        domains,
        tuple(counts.values()),
        tuple(range(1, depth + 1)),
        tuple(rows),
        tuple(verdicts),
        settings,
        tuple(warnings),
    )


def _rows(cells: DomainCells, label: str, b: _Block, scopes: tuple[str, ...]) -> list[DrafterRow]:
    """One drafter's row per domain and All."""
    tau = cells.estimates(cells.mean(b.tau, b.steps), b.steps)
    decoded = cells.estimates(cells.mean(b.positions, b.decoding_steps), b.decoding_steps)
    share = cells.estimates(cells.mean(b.proposed, b.steps), b.steps)
    chain = cells.estimates(cells.mean(b.accepted, b.chain), b.chain)
    return [
        DrafterRow(
            label,
            scope,
            int(cells.prompts[g, b.steps][0]),
            int(cells.totals[0, g, b.steps][0]),
            tau[g, 0],
            decoded[g, 0],
            bounded(share[g, 0]),
            tuple(bounded(e) for e in chain[g]),
        )
        for g, scope in enumerate(scopes)
    ]


def _verdict(
    a: str, b: str, domain: str, e: Estimate, counts: dict[str, int], settings: Settings
) -> DrafterVerdict:
    """The verdict on "a accepts more than b" in ``domain`` (ALL: over every domain)."""
    involved = counts if domain == ALL else {domain: counts[domain]}
    need = settings.min_prompts
    figure = f"Δ tau {e.format(3, signed=True)}"
    if min(involved.values()) < need:
        have = ", ".join(f"{d} {n}" for d, n in involved.items())
        why = f"not testable: {min(involved.values())} shared prompts ({have}), need {need}"
        return DrafterVerdict(domain, a, b, e, Verdict.UNTESTABLE, f"{why}; {figure}")
    verdict = one_sided_verdict(e, settings.confidence)
    detail = f"{figure} over {sum(involved.values())} prompts (paired)"
    if verdict == Verdict.UNTESTABLE:
        detail = f"not testable: the difference has no interval; {figure}"
    return DrafterVerdict(domain, a, b, e, verdict, detail)
