"""Per-domain speculation budgets against per-node stops, at matched drafting cost.

The paper concludes "domain-aware speculation budgets": draft further for a request of a domain
that accepts more. A target-free per-node stop (draft probability >= p, draft entropy <= h,
both known before the target runs) is the other lever. This module replays a run's recorded
trees as greedy decoding (:mod:`.replay`) under four families of drafting policies and compares
their decoded tokens per step at the same drafting cost:

- *fixed shape*: one top-1 chain of K nodes for all traffic (K = 1 .. the measured spine);
- *per-domain budget*: a chain of K_d nodes per domain (the paper's implication);
- *fixed shape + stop*: one chain of K with one stop rule for all traffic (a threshold of p >= 0,
  no stop, is among them, so this family contains the fixed shapes);
- *per-domain shape + stop*: a chain and a stop rule per domain.

Stop thresholds are the deciles of the signal over the measured chains' nodes (a grid fixed by the
signal alone, never by acceptance). Shapes are chains: a chain's verified nodes and draft passes
coincide until a stop cuts it, so one cost axis prices every policy without a price ratio between
a draft pass and a verified node (a tree would need one). Costs, per emitted token:

- *draft passes*: per step, the deepest drafting position the policy evaluates; a stop is seen when
  the draft's pass at that position returns the stopped token's probability, so a chain of K cut
  before node j costs j passes (not j - 1) and one cut at its first node costs one pass and drafts
  nothing;
- *verified nodes*: the nodes the target verifies (the kept nodes).

Matched cost. Within a scope (one domain, or all traffic), the cost levels are the draft passes
per token of the fixed chains of K = 1 .. D. At each level every family takes its setting with the
most tokens per step among those costing no more (``matched`` = draft passes); and, for what each
saves, its setting with the fewest draft passes among those giving at least the chain of K's tokens
per step (``matched`` = tokens per step; ``passes saved`` = 1 - its passes over the chain's). A
per-domain family's setting in the pooled scope is the combination of per-domain settings that
maximises pooled tokens per step under the pooled cost (exactly, over the per-domain Pareto
fronts). Within one domain, "fixed" and "per-domain" coincide, so a domain's rows show the
per-domain families only.

Selection. Every family takes its best setting on all prompts, and every bootstrap replicate
(prompts resampled within domains, :class:`.stats.ClusterBootstrap`) takes it again on its own
resample, so the optimism of choosing the best of many settings is in both families' figures, and
the selection's variability in their intervals; the verdict's difference is corrected for the
optimism left (twice the sample's figure less the replicates' mean). Choosing on one half and
measuring on the other was tried first: it measures a policy learned from half the prompts, and
the per-domain budget, with more settings per half, lost more to the choice (8 of 100 worlds
where the two are equal said "holds").

The verdict on "a per-node stop gives more tokens per step than a per-domain budget at the same
drafting cost" (pooled: the fixed shape + stop against the per-domain budget; within a domain: the
chain + stop against the chain) is decided on the mean, over the cost levels K = 1 .. D, of the
difference in tokens per step: holds if significantly above 0, does not hold if significantly
below (one-sided tests at half of 1 - confidence, :func:`.findings.one_sided_verdict`),
inconclusive otherwise, not testable without a stop signal in the records or an interval, or
with fewer than ``Settings.min_prompts`` (10) prompts in a domain of the scope.
Its false-positive rate is measured on synthetic records where the two are equal by construction,
and its power where a stop truly pays (``lab.synthetic.synthetic_stop_frames``; ``tests/test_budgets.py``).

It does not time anything (the speed side is the chooser's, :mod:`specscope.tune`), nor model
sampling, nor replay trees other than the measured top-1 chain's prefixes.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..records import Run
from .findings import Verdict, one_sided_verdict
from .prepare import ALL
from .render import Column, Grid
from .replay import (
    Candidate,
    ReplayError,
    ReplayRecords,
    StopRule,
    accepted_lengths,
    index_records,
    step_positions,
    top_chain,
)
from .results import Settings
from .stats import ClusterBootstrap, Estimate, nan_estimate, ratio

QUANTILES = tuple(round(0.1 * k, 1) for k in range(1, 10))  # the stop thresholds' deciles
MATCHED = ("draft passes", "tokens per step")  # what each family's setting is matched on


@dataclass(frozen=True)
class Family:
    name: str
    per_domain: bool  # a setting per domain (else one for all traffic)
    stops: bool  # stop rules allowed (else plain chains)


FIXED = Family("fixed shape", False, False)
BUDGET = Family("per-domain budget", True, False)
STOP = Family("fixed shape + stop", False, True)
BOTH = Family("per-domain shape + stop", True, True)
FAMILIES = (FIXED, BUDGET, STOP, BOTH)


# --- what each setting costs and delivers, per prompt --------------------------------------------


def stop_grid(rec: ReplayRecords, quantiles: tuple[float, ...] = QUANTILES) -> list[Candidate]:
    """The top-1 chains of K = 1 .. D, then each with a stop at each of the signals' ``quantiles``
    (over the chains' nodes; draft probability and draft entropy where the records hold them)."""
    depth = rec.spine_depth
    chains: list[Candidate] = [top_chain(k) for k in range(1, depth + 1)]
    if not rec.has_nodes or not depth:
        return chains
    on_chain = np.isin(rec.node_path, rec.path_index(top_chain(depth).shape.paths))
    stops: list[Candidate] = []
    for name, key in (("p_draft", "p_min"), ("draft_entropy", "h_max")):
        signal = rec.signals.get(name)
        if signal is None or np.isnan(signal[on_chain]).any():
            continue
        values = np.unique(np.round(np.quantile(signal[on_chain], quantiles), 4))
        stops += [StopRule(c, **{key: float(v)}) for c in chains for v in values]
    return chains + stops


def draft_passes(rec: ReplayRecords, candidate: Candidate, fed: np.ndarray) -> np.ndarray:
    """(positions,) the draft passes of each position's tree: the root's and one per level fed to
    the draft (``fed``, from :func:`~specscope.analysis.replay.accepted_lengths`), which is the
    depth of the deepest node the drafting evaluates, kept or stopped; 0 where none is drafted."""
    uncut = (candidate.base if isinstance(candidate, StopRule) else candidate).keep(rec)
    drafted = np.bincount(rec.node_position[uncut], minlength=rec.n_positions) > 0
    return np.where(drafted, fed + 1, 0)


@dataclass(frozen=True, eq=False)
class SettingSums:
    """Per prompt and setting, over greedy decoding's steps: what each setting of a grid does."""

    labels: tuple[str, ...]  # (S,)
    stops: np.ndarray  # (S,) bool: the setting has a stop rule
    positions: np.ndarray  # (P,) output tokens
    steps: np.ndarray  # (P, S) decoding steps (target passes)
    passes: np.ndarray  # (P, S) draft passes
    nodes: np.ndarray  # (P, S) verified nodes


def setting_sums(
    rec: ReplayRecords, candidates: list[Candidate], prefill_drafts: bool = True
) -> SettingSums:
    prompt, P = rec.position_prompt(), rec.n_prompts
    steps, passes, nodes = (np.zeros((P, len(candidates))) for _ in range(3))
    for s, cand in enumerate(candidates):
        accepted, size, fed = accepted_lengths(rec, cand)
        at = step_positions(rec, accepted, prefill_drafts)
        steps[:, s] = np.bincount(prompt[at], minlength=P) + (0 if prefill_drafts else 1)
        nodes[:, s] = np.bincount(prompt[at], weights=size[at], minlength=P)
        cost = draft_passes(rec, cand, fed) if rec.has_nodes else size
        passes[:, s] = np.bincount(prompt[at], weights=cost[at], minlength=P)
    return SettingSums(
        tuple(c.label for c in candidates),
        np.array([isinstance(c, StopRule) for c in candidates]),
        rec.lengths.astype(float),
        steps,
        passes,
        nodes,
    )


# --- choosing a family's setting at a cost ----------------------------------------------------


def _pareto(cost: np.ndarray, steps: np.ndarray, choice: np.ndarray) -> tuple:
    """The points no other point beats on both cost and steps (sorted by cost)."""
    order = np.lexsort((steps, cost))
    cost, steps, choice = cost[order], steps[order], choice[order]
    best_before = np.minimum.accumulate(np.r_[np.inf, steps[:-1]])
    keep = steps < best_before
    return cost[keep], steps[keep], choice[keep]


def _front(passes: np.ndarray, steps: np.ndarray, allowed: np.ndarray, per_domain: bool) -> tuple:
    """The Pareto front (total draft passes, total steps, (n, G) setting per domain) of a family
    over per-domain sums ``passes``, ``steps``: (G, S)."""
    idx = np.flatnonzero(allowed)
    G = passes.shape[0]
    if not per_domain:
        return _pareto(
            passes[:, idx].sum(0), steps[:, idx].sum(0), np.repeat(idx[:, None], G, axis=1)
        )
    cost, total, choice = np.zeros(1), np.zeros(1), np.zeros((1, 0), np.int64)
    for g in range(G):
        c, s, ch = _pareto(passes[g, idx], steps[g, idx], idx[:, None])
        cost = (cost[:, None] + c[None, :]).ravel()
        total = (total[:, None] + s[None, :]).ravel()
        choice = np.hstack([np.repeat(choice, len(c), axis=0), np.tile(ch, (len(choice), 1))])
        cost, total, choice = _pareto(cost, total, choice)
    return cost, total, choice


def _hull(front: tuple) -> tuple:
    """The front's lower convex hull in (cost, steps): the settings no alternation of two others
    beats (sorted by cost)."""
    cost, steps, choice = front
    keep: list[int] = []
    for i in range(len(cost)):
        while len(keep) >= 2:
            a, b = keep[-2], keep[-1]  # b lies on or above the chord from a to i: drop it
            if (steps[b] - steps[a]) * (cost[i] - cost[a]) >= (steps[i] - steps[a]) * (
                cost[b] - cost[a]
            ):
                keep.pop()
            else:
                break
        keep.append(i)
    return cost[keep], steps[keep], choice[keep]


def _pick(front: tuple, positions: float, matched: str, level: float) -> list[tuple] | None:
    """The alternation of two neighbouring settings on the family's hull (weights, settings per
    domain) with the most tokens per step at draft passes per token ``level``, or (``matched``
    tokens per step) the fewest draft passes at ``level`` tokens per step; None if the family
    cannot reach it."""
    cost, steps, choice = _hull(front)
    if matched == MATCHED[0]:
        x, budget = cost, level * positions  # cost rises along the hull
    else:
        x, budget = -steps, -positions / level  # steps fall along the hull
    tol = 1e-9 * positions
    if budget < x[0] - tol:
        return None
    j = int(np.searchsorted(x, budget + tol, side="right")) - 1
    if j >= len(x) - 1 or abs(budget - x[j]) <= tol:
        return [(1.0, choice[min(j, len(x) - 1)])]
    w = (budget - x[j]) / (x[j + 1] - x[j])
    return [(1.0 - w, choice[j]), (w, choice[j + 1])]


# --- the comparison -------------------------------------------------------------------------------


def levels(depth: int) -> tuple[float, ...]:
    """The cost levels: each chain's of 1 .. ``depth`` nodes, and halfway between consecutive
    ones (where a family that mixes settings, or stops, can sit and a fixed chain cannot)."""
    return tuple(1 + k / 2 for k in range(2 * depth - 1))


@dataclass(frozen=True)
class BudgetRow:
    """One family at one cost level (the fixed chain of ``level`` nodes) in one scope."""

    scope: str  # a domain, or ALL
    level: float  # K: the cost of the chain of K nodes (halfway between two chains' at K + 0.5)
    matched: str  # what the family's setting matches the chain of ``level`` on (MATCHED)
    family: str
    chosen: str  # the setting chosen on all prompts
    tokens_per_step: Estimate
    passes_per_token: Estimate
    nodes_per_token: Estimate
    passes_saved: Estimate  # 1 - draft passes over the fixed chain's (NaN: matched passes)


@dataclass(frozen=True)
class BudgetVerdict:
    scope: str
    stop_family: str
    budget_family: str
    gain: Estimate  # mean over levels of tokens per step, stop family minus budget family
    verdict: Verdict


@dataclass(frozen=True)
class BudgetComparison:
    depth: int  # the longest chain (cost levels K = 1 .. depth)
    settings: int  # settings in the grid
    rows: tuple[BudgetRow, ...]
    verdicts: tuple[BudgetVerdict, ...]

    def row(self, scope: str, level: float, family: str, matched: str = MATCHED[0]) -> BudgetRow:
        for r in self.rows:
            if (r.scope, r.level, r.family, r.matched) == (scope, level, family, matched):
                return r
        raise KeyError((scope, level, family, matched))

    def verdict(self, scope: str = ALL, stop_family: str = "fixed shape + stop") -> BudgetVerdict:
        """The verdict in ``scope`` (within a domain: the per-domain shape + stop's)."""
        return next(
            v
            for v in self.verdicts
            if v.scope == scope and (v.stop_family == stop_family or scope != ALL)
        )


CLAIM = (
    "a per-node stop gives more tokens per step than a per-domain budget at the same drafting cost"
)


def _short(label: str) -> str:
    """A setting's label for the table: "chain(3) while p_draft >= 0.32" -> "3 p>=0.32"
    (H<=: draft entropy at most)."""
    label = re.sub(r"chain\((\d+)\)", r"\1", label)
    return label.replace(" while p_draft >= ", " p>=").replace(" while draft entropy <= ", " H<=")


def _label(sums: SettingSums, picked: list[tuple] | None, names: tuple[str, ...]) -> str:
    """The chosen settings, e.g. "75% chat 1, code 2 + 25% chat 1, code 3" (nodes per chain)."""
    if picked is None:
        return "none"
    share = len(picked) > 1

    def one(w: float, choice: np.ndarray) -> str:
        settings = set(choice.tolist())
        text = (
            _short(sums.labels[int(choice[0])])
            if len(settings) == 1
            else ", ".join(f"{d} {_short(sums.labels[int(s)])}" for d, s in zip(names, choice))
        )
        return f"{w:.0%} {text}" if share else text

    return " + ".join(one(w, choice) for w, choice in picked if w > 0)


def _hull_values(passes: np.ndarray, steps: np.ndarray, nodes: np.ndarray, allowed: np.ndarray,
                 per_domain: bool) -> tuple:  # fmt: skip
    """A family's hull over per-domain totals (G, S): its points' (draft passes, steps, verified
    nodes), and the front itself (for the chosen settings' labels)."""
    front = _front(passes, steps, allowed, per_domain)
    cost, total, choice = _hull(front)
    verified = nodes[np.arange(nodes.shape[0])[None, :], choice].sum(axis=1)
    return np.vstack([cost, total, verified]), front


def _along(x: np.ndarray, values: np.ndarray, at: np.ndarray, tol: float) -> np.ndarray:
    """(3, L) ``values`` (3, n) of the hull interpolated at ``at`` (L,) along its increasing
    ``x`` (the alternation of two neighbouring settings, as :func:`_pick`); NaN below its first
    point, its last point beyond its last."""
    at = np.where(at < x[0] - tol, np.nan, np.maximum(at, x[0]))
    return np.stack([np.interp(at, x, v) for v in values])


def _targets(passes: np.ndarray, steps: np.ndarray, positions: float, depth: int) -> tuple:
    """The cost levels in one scope: the fixed chains' draft passes per token at :func:`levels`,
    and their tokens per step at the whole levels (the chain of k nodes is setting k - 1)."""
    per_pass = passes[:, :depth].sum(0) / positions
    per_step = positions / steps[:, :depth].sum(0)
    k = np.arange(1, depth + 1)
    at = np.array(levels(depth))
    return np.interp(at, k, per_pass), per_step


def _scope_curves(tot: tuple, positions: float, depth: int, stops: np.ndarray, families) -> dict:
    """Per family, (3, L) steps-per-token figures at the levels matched on draft passes and on
    tokens per step: tokens per step, draft passes per token, verified nodes per token."""
    passes, steps, nodes = tot
    by_pass, by_step = _targets(passes, steps, positions, depth)
    tol = 1e-9 * positions
    out = {}
    for family in families:
        allowed = np.ones(len(stops), bool) if family.stops else ~stops
        hull, _ = _hull_values(passes, steps, nodes, allowed, family.per_domain)
        cost, total = hull[0], hull[1]
        a = _along(cost, hull, by_pass * positions, tol)
        b = _along(-total, hull, -positions / by_step, tol)
        out[family.name] = {
            m: np.vstack([positions / v[1], v[0] / positions, v[2] / positions])
            for m, v in zip(MATCHED, (a, b))
        }
    return out


def compare_budgets(
    source: Run | str | Path | ReplayRecords,
    settings: Settings | None = None,
    quantiles: tuple[float, ...] = QUANTILES,
    prefill_drafts: bool = True,
    scopes: str = "all",
) -> BudgetComparison:
    """The four families at the fixed chains' cost levels, per domain and pooled, with the
    verdict on :data:`CLAIM` in each scope (see the module's docstring). ``scopes``: "all" (every
    domain and the pooled scope) or "pooled" (the pooled scope alone, e.g. for simulations)."""
    settings = settings or Settings()
    rec = index_records(source)
    depth = rec.spine_depth
    if not depth:
        raise ReplayError("the records hold no top-1 chain: nothing to budget")
    sums = setting_sums(rec, stop_grid(rec, quantiles), prefill_drafts)
    G = len(rec.domains)
    boot = ClusterBootstrap.draw(
        rec.prompt_domain, settings.n_boot, settings.seed, settings.confidence
    )
    # (B + 1, P, G) resample weights by domain; totals (B + 1, G, S), positions (B + 1, G)
    by_domain = boot.weights[:, :, None] * np.eye(G)[rec.prompt_domain][None]
    totals = [np.einsum("bpg,ps->bgs", by_domain, x) for x in (sums.passes, sums.steps, sums.nodes)]
    positions = np.einsum("bpg,p->bg", by_domain, sums.positions)
    all_scopes = [(rec.domains[g], np.array([g])) for g in range(G)] + [(ALL, np.arange(G))]
    if scopes == "pooled":
        all_scopes = all_scopes[-1:]
    B1 = boot.weights.shape[0]
    L, Lk = len(levels(depth)), depth
    # curves[scope][family][matched]: (B + 1, 3, levels)
    curves: dict = {}
    labels: dict = {}
    for name, scope in all_scopes:
        families = FAMILIES if len(scope) > 1 else (BUDGET, BOTH)
        curves[name] = {
            f.name: {MATCHED[0]: np.empty((B1, 3, L)), MATCHED[1]: np.empty((B1, 3, Lk))}
            for f in families
        }
        for b in range(B1):
            tot = tuple(t[b, scope] for t in totals)
            pos = float(positions[b, scope].sum())
            for f, by in _scope_curves(tot, pos, depth, sums.stops, families).items():
                for m in MATCHED:
                    curves[name][f][m][b] = by[m]
        labels[name] = _chosen(rec, sums, scope, families, depth, totals, positions)
    rows, verdicts = [], []
    per_domain = np.bincount(rec.prompt_domain, minlength=G)
    for name, scope in all_scopes:
        members = np.isin(rec.prompt_domain, scope)

        figure = functools.partial(
            boot.estimate,
            n=int(sums.positions[members].sum()),
            prompts=int(members.sum()),
            strata=len(scope),
        )

        for family, by in curves[name].items():
            for m in MATCHED:
                for i, level in enumerate(levels(depth) if m == MATCHED[0] else levels(depth)[::2]):
                    tps, ppt, npt = (by[m][:, j, i] for j in range(3))
                    saved = nan_estimate()
                    if m == MATCHED[1]:
                        ref = curves[name][FIXED.name if name == ALL else BUDGET.name][m]
                        saved = figure(1 - ratio(ppt, ref[:, 1, i]))
                    rows.append(
                        BudgetRow(name, level, m, family, labels[name][family, m, level],
                                  figure(tps), figure(ppt), figure(npt), saved)
                    )  # fmt: skip
        few = bool((per_domain[scope] < settings.min_prompts).any())
        for stop in (STOP, BOTH) if len(scope) > 1 else (BOTH,):
            diff = (
                curves[name][stop.name][MATCHED[0]][:, 0]
                - curves[name][BUDGET.name][MATCHED[0]][:, 0]
            )
            gain = figure(_debiased(diff.mean(axis=1))) if sums.stops.any() else nan_estimate()
            verdict = one_sided_verdict(gain, settings.confidence)
            if few:  # below the calibrated sample size: no verdict
                verdict = Verdict.UNTESTABLE
            verdicts.append(BudgetVerdict(name, stop.name, BUDGET.name, gain, verdict))
    return BudgetComparison(depth, len(sums.labels), tuple(rows), tuple(verdicts))


def _debiased(reps: np.ndarray) -> np.ndarray:
    """(B + 1,) replicates with the sample's figure corrected for the choice's optimism as the
    bootstrap measures it: the replicates' mean excess over the sample's figure is taken off it."""
    if len(reps) < 3 or not np.isfinite(reps).all():
        return reps
    return np.r_[2 * reps[0] - reps[1:].mean(), reps[1:]]


def _chosen(rec, sums, scope, families, depth, totals, positions) -> dict:
    """The settings each family takes on all prompts, per (family, matched, level)."""
    names = tuple(rec.domains[g] for g in scope)
    passes, steps = totals[0][0, scope], totals[1][0, scope]
    pos = float(positions[0, scope].sum())
    by_pass, by_step = _targets(passes, steps, pos, depth)
    out = {}
    for family in families:
        allowed = np.ones(len(sums.labels), bool) if family.stops else ~sums.stops
        front = _front(passes, steps, allowed, family.per_domain)
        for level, target in zip(levels(depth), by_pass):
            out[family.name, MATCHED[0], level] = _label(
                sums, _pick(front, pos, MATCHED[0], target), names
            )
        for level, target in zip(levels(depth)[::2], by_step):
            out[family.name, MATCHED[1], level] = _label(
                sums, _pick(front, pos, MATCHED[1], target), names
            )
    return out


# --- tables and the plot -------------------------------------------------------------------------


def budget_grids(c: BudgetComparison) -> list:
    """The families at matched cost, and the verdicts."""
    rows = tuple(
        (
            r.scope,
            r.level,
            r.matched,
            r.family,
            r.tokens_per_step,
            r.passes_per_token,
            r.nodes_per_token,
            r.passes_saved,
            r.chosen,
        )  # fmt: skip
        for r in c.rows
    )
    table = Grid(
        "budgets",
        "Per-domain budgets against per-node stops, at matched drafting cost",
        (
            Column("Scope"),
            Column("K", 1),
            Column("Matched on"),
            Column("Family"),
            Column("tokens per step"),
            Column("draft passes per token"),
            Column("verified nodes per token"),
            Column("draft passes saved", signed=True),
            Column("Setting"),
        ),
        rows,
        f"Greedy decoding replayed from the records. K: at the drafting cost of the top-1 chain "
        f"of K nodes (matched on draft passes: each family's setting with the most tokens per "
        f"step at no more draft passes per token), or at its tokens per step (matched on tokens "
        f"per step: the setting with the fewest draft passes giving at least as many; draft "
        f"passes saved against the chain). Settings: chains of 1 to {c.depth} nodes, each with a "
        f"stop at the deciles of draft probability (p>=) and of draft entropy (H<=) "
        f"({c.settings} in all), chosen on all prompts (a setting per domain: 'chat 2, code 3'; "
        "'75% a + 25% b': alternating two). Within a domain, fixed and per-domain families "
        "coincide. Intervals: prompts resampled within domains, each resample choosing its own "
        "settings.",
    )
    verdicts = Grid(
        "budget_verdicts",
        "A per-node stop against a per-domain budget at the same drafting cost",
        (
            Column("Scope"),
            Column("Stop family"),
            Column("Budget family"),
            Column("tokens per step gained", signed=True),
            Column("Verdict"),
        ),
        tuple(
            (v.scope, v.stop_family, v.budget_family, v.gain, v.verdict.value) for v in c.verdicts
        ),
        f"Claim: {CLAIM}. Gained: the mean over the cost levels K = 1 to {c.depth} of the stop "
        "family's tokens per step minus the budget family's, matched on draft passes, less the "
        "choice's optimism as the resamples measure it. Holds if "
        "significantly above 0, does not hold if significantly below (one-sided, half of 1 - "
        "confidence each); false-positive rate measured on synthetic records where the two are "
        "equal by construction, power where a stop pays (tests/test_budgets.py).",
    )
    return [table, verdicts]


def budget_plot(c: BudgetComparison):
    """Tokens per step against draft passes per token, one line per family, one panel per
    domain and one pooled (matplotlib: the ``plot`` extra)."""
    from .plots import _figure

    scopes = list(dict.fromkeys(r.scope for r in c.rows))
    fig = _figure(3.4 * len(scopes), 3.6, domain_cycle=False)
    axes = fig.subplots(1, len(scopes), squeeze=False)[0]
    for ax, scope in zip(axes, scopes):
        for family in FAMILIES:
            rows = [
                r
                for r in c.rows
                if (r.scope, r.family, r.matched) == (scope, family.name, MATCHED[0])
            ]
            if rows:
                x = [r.passes_per_token.value for r in rows]
                y = [r.tokens_per_step.value for r in rows]
                ax.plot(x, y, "o-", markersize=3.5, linewidth=1.2, label=family.name)
        ax.set_title(scope, fontsize=10)
        ax.set_xlabel("draft passes per token")
        ax.grid(alpha=0.25, linewidth=0.6)
    axes[0].set_ylabel("tokens per step")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("Families at the fixed chains' cost levels")
    return fig
