"""What a run delivers when decoded, beside its node-level tables: the recorded trees replayed
as greedy decoding (decoded tokens per step), domain's effect at node, step and prompt level, the
"task type over depth" verdict where per-task budgets act, and the scorecard of acceptance
predictors with the stop rules it suggests.

:func:`deliver` computes these from a run's records and adds them to its
:class:`~specscope.analysis.results.Analysis` (``Analysis.delivered``); :func:`delivered_grids`
gives their tables. The computations live in :mod:`.replay`, :mod:`.levels` and
:mod:`.scorecard`; this module only assembles them, with the analysis' own settings and
resamples (a level's interval and the node tables' come from the same prompt draws).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .budgets import BudgetComparison, budget_grids, budget_plot, compare_budgets
from .level_grids import (
    decoded_grid,
    domain_effect_grid,
    level_findings_grid,
    level_shares_grid,
)
from .levels import (
    LevelEffects,
    LevelFinding,
    budget_finding,
    finding_level,
    level_effects,
    replayed_tokens,
)
from .plots import Plot, plots_unavailable, save_plot
from .prepare import Records
from .render import Grid
from .replay import DecodedTable, ReplayError, decoded_tokens_per_step
from .resampling import Resampler
from .results import Analysis
from .scorecard import (
    Scorecard,
    ScorecardSettings,
    StopRuleRow,
    scorecard,
    scorecard_grids,
    stop_rule_grid,
    stop_rule_rows,
)


@dataclass(frozen=True)
class StopRules:
    """The top-1 chain replayed under stop rules on the signal the scorecard ranks best."""

    signal: str
    rows: tuple[StopRuleRow, ...]


@dataclass(frozen=True)
class Delivered:
    decoded: DecodedTable  # the run's tree and its top-1 chain replayed as greedy decoding
    levels: LevelEffects  # domain's share of variance at node, step and prompt level
    findings: tuple[LevelFinding, ...]  # the run's findings with the level each is tested at
    scorecard: Scorecard | None  # None: not asked for, or too few prompts (see ``notes``)
    stop_rules: StopRules | None
    notes: tuple[str, ...] = ()
    budgets: BudgetComparison | None = None  # per-domain budgets against per-node stops


def deliver(a: Analysis, rec: Records, predictors: bool = True) -> Analysis:
    """``a`` with :class:`Delivered` added (``a`` must be the analysis of ``rec``, unstratified
    or the whole run). ``predictors``: also score the acceptance predictors (the slowest part)."""
    if a.variance is None:  # a stratum of a run: delivered by the whole run only
        return a
    s = a.settings
    try:
        decoded = decoded_tokens_per_step(rec.run, s)
        tokens = replayed_tokens(rec)
    except ReplayError as e:  # records that are not a decoding trajectory (hand-built, cut)
        return replace(a, warnings=a.warnings + (f"no decoded tokens per step: {e}",))
    levels = level_effects(Resampler(rec, s), a.variance, tokens)
    budget = budget_finding(levels.budget, levels.domain_prompts, s)
    findings = tuple(LevelFinding(finding_level(f.key), f) for f in a.findings) + (budget,)
    card, rules, notes = None, None, ()
    if predictors:
        card_settings = ScorecardSettings(seed=s.seed, confidence=s.confidence)
        if rec.n_prompts < card_settings.folds:
            notes = (
                f"no predictor scorecard: {rec.n_prompts} prompts cannot be split into "
                f"{card_settings.folds} prompt-disjoint folds",
            )
        else:
            card = scorecard(rec, card_settings)
            signal, rows = stop_rule_rows(rec.run, card) if card.stop_signal else ("", [])
            rules = StopRules(signal, tuple(rows)) if rows else None
    budgets = None
    if predictors:
        try:
            budgets = compare_budgets(rec.run, s)
        except ReplayError:  # no top-1 chain to budget
            budgets = None
    delivered = Delivered(decoded, levels, findings, card, rules, notes, budgets)
    return replace(a, delivered=delivered, warnings=a.warnings + notes)


def delivered_grids(a: Analysis) -> list[Grid]:
    """The tables of ``a.delivered`` (none when the analysis has none)."""
    d = a.delivered
    if d is None:
        return []
    grids = [
        decoded_grid(d.decoded),
        level_shares_grid(d.levels),
        domain_effect_grid(d.levels),
        level_findings_grid(d.findings),
    ]
    if d.scorecard is not None:
        grids += scorecard_grids(d.scorecard)
    if d.stop_rules is not None:
        grids.append(stop_rule_grid(d.stop_rules.signal, list(d.stop_rules.rows)))
    if d.budgets is not None:
        grids += budget_grids(d.budgets)
    return grids


def delivered_plots(a: Analysis, out_dir: str | Path, inside: Path | None = None) -> list[Plot]:
    """The plots of ``a.delivered`` beside the analysis' own (:func:`.plots.write_plots`): the
    reliability diagram of the scorecard's best predictors, where it holds a scorecard."""
    d = a.delivered
    if d is None or plots_unavailable():
        return []
    drawn = []
    if d.budgets is not None:
        title = "Tokens per step against draft passes per token, per family and domain"
        drawn.append(save_plot(budget_plot(d.budgets), "budgets", title, out_dir, inside))
    if d.scorecard is None:
        return drawn
    from .scorecard_plots import reliability_plot  # matplotlib: drawn on demand

    card = d.scorecard
    best = [r.predictor for r in (card.best("node"), card.best("prefix")) if r is not None]
    shown = tuple(dict.fromkeys(["draft probability", *best]))
    title = "Reliability of the best acceptance predictors"
    return drawn + [save_plot(reliability_plot(card, shown), "reliability", title, out_dir, inside)]
