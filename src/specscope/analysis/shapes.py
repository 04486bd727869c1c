"""Domain findings across tree shapes: each domain finding, and the ordering of the domains on
each per-domain figure, for every tree shape a run (or a comparison of runs) holds, with the
cases where a verdict or an ordering changes between shapes named.

A run's records hold two shapes: the measured tree, and the top-1 chain within it (the nodes whose
every ancestor, and themselves, have sibling rank 0: the tree a classic chain speculator drafts;
its tau is the chain's accepted length + 1, which the records already imply). Runs measured with
different trees (the paper's 2/4/2 tree and a deep spine) add theirs. A statement such as "chat
has the lowest E[L]" is a fact about a domain only if it holds in every shape; where it holds in
one tree and not in another it is a fact about the pair of domain and tree.

The per-domain figures are E[L] (the paper's formula, alpha), mean alpha, mean greedy acceptance,
decoded tokens per step (the shape's trees replayed as greedy decoding, :mod:`.replay`: what a
decoder gets) and mean tau per recorded position (the position mean, which overstates decoding).
For each figure the domain lowest in the first shape (the reference) is tested for being lowest in
every shape: holds if its figure is significantly below every other domain's (one-sided at half of
1 - confidence each, an intersection-union test), does not hold if some other domain's is
significantly below it (Bonferroni over the other domains), inconclusive otherwise, not testable
below the minimum prompts per domain. The paper's domain findings (:mod:`.findings`) and the budget
verdict (:mod:`.levels`) are evaluated in each shape as they are for a whole run.

Nothing here reads a model or renders (:mod:`.level_grids` turns the results into grids).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SpecscopeError
from .findings import Verdict, one_sided_verdict, shortfall
from .levels import budget_comparison, budget_finding, finding_level
from .prepare import Records
from .replay import MeasuredTree, index_records, replay_counts, top_chain
from .resampling import Resampler
from .results import Analysis, Settings
from .stats import Estimate, nan_estimate, ratio
from .tables import analyze_records, paper_tables, subset_records

MEASURED, CHAIN = "measured tree", "top-1 chain"
E_L, ALPHA, GREEDY = "E[L]", "alpha", "greedy acceptance"
DECODED, TAU = "decoded tokens per step", "tau (position mean)"
QUANTITIES = (E_L, ALPHA, GREEDY, DECODED, TAU)
STEP_LEVEL = {DECODED: "step (decoded: trees replayed)", TAU: "step (tau per recorded position)"}
# the findings of :mod:`.findings` that compare domains
DOMAIN_FINDINGS = (
    "task_type_over_depth",
    "task_type_over_depth_greedy",
    "only_chat_above_one",
    "chat_paradox",
    "below_one_no_speedup",
)
LOWEST = "lowest "  # the key prefix of the "<domain> has the lowest <figure>" checks
ORDERING, VERDICT = "ordering", "verdict"


class ShapesError(SpecscopeError, ValueError):
    """A comparison of tree shapes without runs."""


@dataclass(frozen=True)
class ShapeRecords:
    """One tree shape's records: a run's measured tree, or the top-1 chain within it."""

    run: str  # the run's label, e.g. "paper-protocol"
    tree: str  # MEASURED or CHAIN
    records: Records

    @property
    def name(self) -> str:
        return f"{self.run}: {self.tree}"

    def candidate(self):
        """What greedy decoding drafts in this shape: the measured tree, or its top-1 chain."""
        return MeasuredTree() if self.tree == MEASURED else top_chain(self.records.max_depth)


def top1_chain(rec: Records) -> Records:
    """The run as a chain speculator would have measured it: the top-1 chain's nodes, and each
    step's tau that of the chain alone (steps without nodes keep theirs)."""
    sub = subset_records(rec, rec.nodes.on_chain)
    steps = rec.steps
    accepted = np.where(np.isfinite(steps.chain_len), steps.chain_len, steps.accepted_len)
    accepted = accepted.astype(np.int64)
    chain_steps = dataclasses.replace(steps, accepted_len=accepted, tau=accepted + 1)
    depth = int(sub.nodes.depth.max()) if len(sub.nodes) else 1
    return dataclasses.replace(sub, steps=chain_steps, n_ranks=1, max_depth=depth)


def shapes_of(run: str, rec: Records) -> tuple[ShapeRecords, ShapeRecords]:
    """A run's two shapes: the measured tree and its top-1 chain."""
    return ShapeRecords(run, MEASURED, rec), ShapeRecords(run, CHAIN, top1_chain(rec))


@dataclass(frozen=True)
class DomainFigure:
    domain: str
    quantity: str  # one of QUANTITIES
    value: Estimate


@dataclass(frozen=True)
class ShapeVerdict:
    """One domain finding's verdict in one shape."""

    key: str  # a key of .findings, .levels.BUDGET_KEY, or LOWEST + quantity
    claim: str
    level: str  # the level it is tested at
    verdict: Verdict
    estimate: Estimate  # the headline figure
    detail: str


@dataclass(frozen=True)
class PairDifference:
    """One domain's figure minus another's, in one shape (the same resamples for both)."""

    quantity: str
    first: str
    second: str
    difference: Estimate  # first - second


@dataclass(frozen=True)
class ShapeResult:
    """The per-domain figures, their orderings and the domain findings of one shape."""

    shape: str  # ShapeRecords.name
    run: str
    tree: str
    domain_prompts: tuple[tuple[str, int], ...]
    figures: tuple[DomainFigure, ...]
    orderings: tuple[tuple[str, tuple[str, ...]], ...]  # (quantity, domains lowest first)
    verdicts: tuple[ShapeVerdict, ...]
    differences: tuple[PairDifference, ...]  # every pair of domains, every quantity

    def figure(self, domain: str, quantity: str) -> Estimate | None:
        return next(
            (f.value for f in self.figures if (f.domain, f.quantity) == (domain, quantity)), None
        )

    def ordering(self, quantity: str) -> tuple[str, ...]:
        return dict(self.orderings).get(quantity, ())

    def verdict(self, key: str) -> ShapeVerdict | None:
        return next((v for v in self.verdicts if v.key == key), None)

    def difference(self, quantity: str, first: str, second: str) -> Estimate | None:
        for d in self.differences:
            if (d.quantity, d.first, d.second) == (quantity, first, second):
                return d.difference
        return None


@dataclass(frozen=True)
class PairFlip:
    """Two domains whose order on a figure is not the same in every shape."""

    quantity: str
    first: str
    second: str
    differences: tuple[Estimate | None, ...]  # first - second, per shape (None: not in it)
    resolved: bool  # significantly one way in some shape and the other way in another


@dataclass(frozen=True)
class ShapeChange:
    """A verdict or an ordering of domains that differs between shapes."""

    kind: str  # ORDERING or VERDICT
    subject: str  # the quantity, or the finding's key
    shapes: tuple[str, ...]  # every shape compared
    states: tuple[str, ...]  # per shape: the ordering ("chat 1.23 < math 1.31 < ...") or verdict
    flips: tuple[PairFlip, ...] = ()  # for an ordering: the pairs of domains that swap


@dataclass(frozen=True)
class ShapeComparison:
    shapes: tuple[ShapeResult, ...]
    changes: tuple[ShapeChange, ...]


# --- per shape -------------------------------------------------------------------------------------


def _decoded_reps(eng: Resampler, shape: ShapeRecords) -> np.ndarray:
    """(B + 1, G) replicates of each domain's decoded tokens per step: the shape's trees replayed
    as greedy decoding, output tokens over decoding steps of the resampled prompts."""
    rec = eng.rec
    replayed = index_records(rec.run)
    counts = replay_counts(replayed, shape.candidate())
    order = {pid: i for i, pid in enumerate(replayed.prompt_ids)}
    at = np.array([order.get(pid, -1) for pid in rec.prompt_ids])
    found = at >= 0
    onehot = np.eye(eng.G)[rec.prompt_domain] * found[:, None]
    positions = np.where(found, counts.positions[at], 0)[:, None] * onehot
    steps = np.where(found, counts.steps[at], 0)[:, None] * onehot
    return ratio(eng.boot.total(positions), eng.boot.total(steps))


def _domain_reps(eng: Resampler, shape: ShapeRecords) -> dict[str, np.ndarray]:
    """(B + 1, G) replicates of each per-domain quantity, from the analysis' resamples."""
    alpha_reps = paper_tables(eng, "alpha")[1]
    greedy_reps = paper_tables(eng, "greedy_accept")[1]
    tau = eng.cells(eng.rec.steps.tau.astype(float), table="steps").mean
    G = eng.G
    return {
        E_L: alpha_reps["expected_length"][:, :G],
        ALPHA: alpha_reps["mean"][:, :G],
        GREEDY: greedy_reps["mean"][:, :G],
        DECODED: _decoded_reps(eng, shape),
        TAU: tau[:, :G],
    }


def _figures(a: Analysis, eng: Resampler, decoded: np.ndarray) -> tuple[DomainFigure, ...]:
    """The figures as the analysis shows them (with their intervals); decoded tokens per step
    from the replay's replicates."""
    tau = {r.domain: r.tau for r in a.tau}
    out = []
    for g, domain in enumerate(a.info.domains):
        prompts = int(a.info.domain_prompts[g])
        out += [
            DomainFigure(domain, E_L, a.paper.table2[g].expected_length),
            DomainFigure(domain, ALPHA, a.paper.table1[g].mean),
            DomainFigure(domain, GREEDY, a.greedy.table1[g].mean),
            DomainFigure(domain, DECODED, eng.boot.estimate(decoded[:, g], prompts, prompts)),
            DomainFigure(domain, TAU, tau[domain]),
        ]
    return tuple(out)


def _difference(eng: Resampler, reps: np.ndarray, g: int, h: int) -> Estimate:
    """Domain g's figure minus domain h's, from (B + 1, G) replicates."""
    prompts = np.bincount(eng.rec.prompt_domain, minlength=eng.G)
    return eng.boot.estimate(reps[:, g] - reps[:, h], 0, int(prompts[g] + prompts[h]), 2)


def _pairs(eng: Resampler, reps: dict[str, np.ndarray]) -> tuple[PairDifference, ...]:
    domains = eng.rec.domains
    return tuple(
        PairDifference(q, domains[g], domains[h], _difference(eng, r, g, h))
        for q, r in reps.items()
        for g in range(len(domains))
        for h in range(g + 1, len(domains))
    )


def _lowest(
    eng: Resampler,
    reps: np.ndarray,
    quantity: str,
    domain: str,
    settings: Settings,
    domain_prompts: tuple[tuple[str, int], ...],
) -> ShapeVerdict:
    """Is ``domain``'s figure below every other domain's? (the rule of the module docstring)"""
    rec = eng.rec
    g = rec.domains.index(domain)
    diffs = [(other, _difference(eng, reps, h, g)) for h, other in enumerate(rec.domains) if h != g]
    k = len(diffs)
    strict = 1 - (1 - settings.confidence) / max(k, 1)
    nominal = [one_sided_verdict(e, settings.confidence) for _, e in diffs]
    corrected = [one_sided_verdict(e, strict) for _, e in diffs]
    if why := shortfall(domain_prompts, settings.min_prompts):
        verdict = Verdict.UNTESTABLE
    elif Verdict.FAILS in corrected:
        verdict = Verdict.FAILS
    elif nominal and all(v == Verdict.HOLDS for v in nominal):
        verdict = Verdict.HOLDS
    else:
        verdict = Verdict.INCONCLUSIVE
    detail = "; ".join(f"{other} − {domain} {e.format(3, signed=True)}" for other, e in diffs)
    smallest = min((e for _, e in diffs), key=lambda e: e.value, default=nan_estimate())
    return ShapeVerdict(
        LOWEST + quantity,
        f"{domain} has the lowest {quantity}",
        STEP_LEVEL.get(quantity, "node"),
        verdict,
        smallest,
        f"{why}; {detail}" if why else detail,
    )


def shape_result(
    shape: ShapeRecords, settings: Settings, reference: dict[str, str] | None = None
) -> ShapeResult:
    """One shape's figures, orderings and verdicts; ``reference`` names, per quantity, the domain
    tested for being lowest (default: the lowest here)."""
    rec = shape.records
    a = analyze_records(rec, settings, stratify=None)
    eng = Resampler(rec, settings)
    reps = _domain_reps(eng, shape)
    domain_prompts = tuple((d, int(n)) for d, n in zip(a.info.domains, a.info.domain_prompts))
    orderings = tuple(
        (q, tuple(rec.domains[i] for i in np.argsort(r[0], kind="stable"))) for q, r in reps.items()
    )
    reference = reference or {q: order[0] for q, order in orderings}
    verdicts = [
        ShapeVerdict(f.key, f.claim, finding_level(f.key), f.verdict, f.estimate, f.detail)
        for f in a.findings
        if f.key in DOMAIN_FINDINGS
    ]
    budget = budget_finding(budget_comparison(eng), domain_prompts, settings)
    f = budget.finding
    verdicts.append(ShapeVerdict(f.key, f.claim, budget.level, f.verdict, f.estimate, f.detail))
    verdicts += [
        _lowest(eng, reps[q], q, reference[q], settings, domain_prompts)
        for q in QUANTITIES
        if reference.get(q) in rec.domains
    ]
    return ShapeResult(
        shape.name,
        shape.run,
        shape.tree,
        domain_prompts,
        _figures(a, eng, reps[DECODED]),
        orderings,
        tuple(verdicts),
        _pairs(eng, reps),
    )


# --- across shapes ---------------------------------------------------------------------------------


def _ordering_text(result: ShapeResult, quantity: str) -> str:
    parts = []
    for d in result.ordering(quantity):
        e = result.figure(d, quantity)
        parts.append(f"{d} {e.format(3, interval=False)}" if e is not None else d)
    return " < ".join(parts)


def _flips(
    results: Sequence[ShapeResult], quantity: str, confidence: float
) -> tuple[PairFlip, ...]:
    """The pairs of domains whose order on ``quantity`` differs between shapes; a flip is
    resolved if each order is significant (one-sided, half of 1 - ``confidence``) in some shape."""
    level = (1 - confidence) / 2
    pairs = dict.fromkeys(
        (d.first, d.second) for r in results for d in r.differences if d.quantity == quantity
    )
    out = []
    for first, second in pairs:
        diffs = tuple(r.difference(quantity, first, second) for r in results)
        signs = {np.sign(e.value) for e in diffs if e is not None and e.defined}
        if len(signs - {0.0}) < 2:
            continue
        above = any(e is not None and e.p_above() < level for e in diffs)
        below = any(e is not None and e.p_below() < level for e in diffs)
        out.append(PairFlip(quantity, first, second, diffs, above and below))
    return tuple(out)


def shape_changes(
    results: Sequence[ShapeResult], confidence: float = 0.95
) -> tuple[ShapeChange, ...]:
    """Every ordering and verdict that is not the same in all shapes."""
    names = tuple(r.shape for r in results)
    changes = []
    for q in QUANTITIES:
        orders = [r.ordering(q) for r in results]
        if len(set(orders)) > 1:
            states = tuple(_ordering_text(r, q) for r in results)
            changes.append(ShapeChange(ORDERING, q, names, states, _flips(results, q, confidence)))
    keys = dict.fromkeys(v.key for r in results for v in r.verdicts)
    for key in keys:
        found = [r.verdict(key) for r in results]
        states = tuple(v.verdict.value if v is not None else "—" for v in found)
        if len(set(states)) > 1:
            changes.append(ShapeChange(VERDICT, key, names, states))
    return tuple(changes)


def compare_shapes(
    runs: Sequence[tuple[str, Records]], settings: Settings | None = None, chain: bool = True
) -> ShapeComparison:
    """Each domain finding in every shape of ``runs`` ((label, records) pairs): each run's
    measured tree and, with ``chain``, its top-1 chain. The first shape is the reference: the
    domain lowest there on a figure is the one tested for being lowest everywhere."""
    if not runs:
        raise ShapesError("no runs to compare: give at least one (label, records) pair")
    settings = settings or Settings()
    shapes = [
        s
        for label, rec in runs
        for s in (shapes_of(label, rec) if chain else (ShapeRecords(label, MEASURED, rec),))
    ]
    first = shape_result(shapes[0], settings)
    reference = {q: order[0] for q, order in first.orderings}
    results = [first] + [shape_result(s, settings, reference) for s in shapes[1:]]
    return ShapeComparison(tuple(results), shape_changes(results, settings.confidence))
