"""Effects at three levels: how much of acceptance domain explains at the node, the step and the
prompt (request) level, the domain effect in tokens per step, and the verdict on "task type is a
stronger predictor than depth" at the level a per-task speculation budget needs.

A node's acceptance is mostly the tree's design (sibling rank) and Bernoulli noise, so domain
explains little of it. What speculation delivers is tokens per step and per request, so the same
question is asked of:

- the node level: the variance decomposition of :func:`.effects.variance_decomposition`
  (alpha and greedy acceptance; sequential least-squares shares, not noise-corrected);
- the step level: a step's tokens, tau = accepted_len + 1, split into domain, prompt within
  domain and step within prompt, each share corrected for sampling noise (see
  :func:`prompt_share_reps`) so that the shares recover the population's;
- the prompt level: a prompt's mean tokens per step, split into domain and prompt within domain
  (each prompt counts once, as a request does). Its mean is over the steps the run recorded: by
  default the *position mean* (tau at every recorded output position, as a teacher-forced
  measurement gives it), which overstates decoding; pass :class:`PromptTokens` with decoded tokens
  per step (:func:`replayed_tokens`: the recorded trees replayed as greedy decoding) to use those
  instead. Either way the label says which.

Every share comes with the raw eta^2 as well (the figure a one-way ANOVA prints) and a
prompt-clustered interval from the analysis' resamples (prompts resampled within domains).

This module computes figures and verdicts; it renders nothing (:mod:`.level_grids` turns them
into grids) and does not decide the paper's other findings (:mod:`.findings`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecscopeError
from .findings import Finding, Verdict, one_sided_verdict, shortfall
from .prepare import Records
from .replay import MeasuredTree, index_records, replay_counts
from .resampling import Resampler
from .results import Settings, VarianceDecomposition
from .stats import (
    ClusterBootstrap,
    Estimate,
    eta_squared_reps,
    explained_share_reps,
    nan_estimate,
    ratio,
)

NODE, STEP, PROMPT = "node", "step", "prompt"
POSITION_MEAN = "position mean"  # tau averaged over the recorded output positions
DECODED = "decoded (replay)"  # output tokens over greedy decoding's steps (.replay)
WITHIN_DOMAIN = "prompt within domain"
WITHIN_PROMPT = "step within prompt"
RESIDUAL = "residual"


class LevelsError(SpecscopeError, ValueError):
    """Per-prompt tokens that do not fit the run's prompts."""


@dataclass(frozen=True)
class PromptTokens:
    """Tokens per step of each prompt, for the prompt level: ``values[i]`` is prompt ``i``'s (in
    ``Records.prompt_ids`` order; NaN where it has none), ``label`` what they are."""

    label: str  # e.g. "decoded (replay)"
    values: np.ndarray  # (P,)


@dataclass(frozen=True)
class Component:
    """One source's share of the variance of a level's measure."""

    name: str  # "domain", WITHIN_DOMAIN, WITHIN_PROMPT, a node-level factor, RESIDUAL
    share: Estimate


@dataclass(frozen=True)
class LevelShares:
    """The variance of one measure at one level, and the share of it that domain explains."""

    level: str  # NODE, STEP or PROMPT
    measure: str  # what varies: "alpha", "tau (position mean)", ...
    units: int  # nodes, steps or prompts behind it
    domain_raw: Estimate  # eta^2 of domain (one-way, not corrected for sampling noise)
    domain: Estimate  # domain's noise-corrected share
    components: tuple[Component, ...]  # shares that sum to 1 (see the module docstring)

    def component(self, name: str) -> Estimate:
        return next((c.share for c in self.components if c.name == name), nan_estimate())


@dataclass(frozen=True)
class DomainEffect:
    """One domain's tokens per step against the other domains', in natural units."""

    level: str  # STEP (mean over steps) or PROMPT (mean over prompts of their means)
    measure: str
    domain: str
    mean: Estimate  # the domain's mean tokens per step
    others: Estimate  # the mean of the other domains' means (each domain weighted alike)
    relative: Estimate  # mean / others - 1: -0.18 is "18% below the other domains"


@dataclass(frozen=True)
class BudgetComparison:
    """Domain against depth as predictors of what a speculation budget multiplies: the greedy
    acceptance of a top-1-chain node whose parent path is accepted (see :func:`budget_finding`)."""

    edges: int  # such nodes
    prompts: int
    depths: int
    domain: Estimate  # noise-corrected share of their variance explained by domain
    depth: Estimate  # the same for depth
    difference: Estimate  # domain - depth


@dataclass(frozen=True)
class LevelEffects:
    """The three levels of one run (or one tree shape within it)."""

    tokens: str  # what the prompt level's tokens per step are (POSITION_MEAN or a replay's label)
    shares: tuple[LevelShares, ...]
    effects: tuple[DomainEffect, ...]
    budget: BudgetComparison
    domain_prompts: tuple[tuple[str, int], ...]  # prompts per domain

    def level(self, level: str, measure: str | None = None) -> LevelShares | None:
        return next(
            (s for s in self.shares if s.level == level and measure in (None, s.measure)), None
        )

    def effect(self, level: str, domain: str) -> DomainEffect | None:
        return next((e for e in self.effects if (e.level, e.domain) == (level, domain)), None)


# --- estimators ------------------------------------------------------------------------------------


def prompt_share_reps(boot: ClusterBootstrap, prompt: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Share of the variance of x between prompts, corrected for the within-prompt noise of each
    prompt's mean: ``(SS_between - (P - 1) MS_within) / SS_total`` with ``MS_within =
    SS_within / (N - P)`` (the ANOVA method of moments; ``P`` the prompts drawn, ``N`` the
    observations). The raw share :func:`.stats.eta_squared_prompt_reps` counts that noise as
    prompt-to-prompt variance, by about ``(1 - share) * P / N``."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return np.full(boot.n_boot + 1, np.nan)
    x = x - x.mean()
    P = boot.n_prompts
    n_p = np.bincount(prompt, minlength=P).astype(float)
    s_p = np.bincount(prompt, weights=x, minlength=P)
    q_p = np.bincount(prompt, weights=x * x, minlength=P)
    per = np.column_stack([n_p, s_p, q_p, np.nan_to_num(ratio(s_p**2, n_p)), n_p > 0])
    n, s, q, between_p, drawn = boot.total(per).T
    grand = ratio(s**2, n)
    total, between = q - grand, between_p - grand
    ms_within = ratio(q - between_p, n - drawn)
    return ratio(between - (drawn - 1) * ms_within, total)


def _estimate(eng: Resampler, reps: np.ndarray, n: int, prompts: int) -> Estimate:
    return eng.boot.estimate(reps, n, prompts, eng.G)


def _node_shares(variance: VarianceDecomposition) -> tuple[LevelShares, ...]:
    """The node level from the node-level decomposition (its sequential shares as components)."""
    out = []
    for metric in dict.fromkeys(r.metric for r in variance.rows):
        rows = [r for r in variance.rows if r.metric == metric]
        domain = next(r for r in rows if r.factor == "domain")
        out.append(
            LevelShares(
                NODE,
                metric,
                domain.one_way.n,
                domain.one_way,
                domain.corrected,
                tuple(
                    Component(r.factor, r.sequential)
                    for r in rows
                    if r.factor == RESIDUAL or r.levels > 1  # a factor of one level explains 0
                ),
            )
        )
    return tuple(out)


def _step_shares(eng: Resampler) -> LevelShares:
    rec, boot = eng.rec, eng.boot
    steps = rec.steps
    tau = steps.tau.astype(float)
    n, p = len(steps), len(np.unique(steps.prompt))
    raw = eta_squared_reps(boot, steps.prompt, tau, steps.domain, eng.G)
    domain = explained_share_reps(boot, steps.prompt, rec.prompt_domain, tau, steps.domain, eng.G)
    prompts = prompt_share_reps(boot, steps.prompt, tau)
    return LevelShares(
        STEP,
        f"tau ({POSITION_MEAN})",
        n,
        _estimate(eng, raw, n, p),
        _estimate(eng, domain, n, p),
        (
            Component("domain", _estimate(eng, domain, n, p)),
            Component(WITHIN_DOMAIN, _estimate(eng, prompts - domain, n, p)),
            Component(WITHIN_PROMPT, _estimate(eng, 1 - prompts, n, p)),
        ),
    )


def position_mean_tokens(eng: Resampler) -> PromptTokens:
    """Each prompt's mean tau over its recorded steps (NaN for a prompt without steps)."""
    steps, P = eng.rec.steps, eng.rec.n_prompts
    values = ratio(
        np.bincount(steps.prompt, weights=steps.tau.astype(float), minlength=P),
        np.bincount(steps.prompt, minlength=P),
    )
    return PromptTokens(POSITION_MEAN, values)


def replayed_tokens(rec: Records) -> PromptTokens:
    """Each prompt's decoded tokens per step: its recorded trees replayed as greedy decoding
    (:func:`.replay.replay_counts` of the measured tree; output tokens over decoding steps)."""
    replayed = index_records(rec.run)
    counts = replay_counts(replayed, MeasuredTree())
    per_prompt = dict(zip(replayed.prompt_ids, ratio(counts.positions, counts.steps)))
    values = np.array([per_prompt.get(pid, np.nan) for pid in rec.prompt_ids], dtype=float)
    return PromptTokens(DECODED, values)


def _checked(eng: Resampler, tokens: PromptTokens) -> np.ndarray:
    values = np.asarray(tokens.values, dtype=float)
    if values.shape != (eng.rec.n_prompts,):
        raise LevelsError(
            f"tokens per step '{tokens.label}' has {values.shape} values; the run has "
            f"{eng.rec.n_prompts} prompts: one value per prompt is allowed (NaN for none)"
        )
    return values


def _prompt_shares(eng: Resampler, tokens: PromptTokens) -> LevelShares:
    rec = eng.rec
    x = _checked(eng, tokens)
    idx = np.flatnonzero(np.isfinite(x))
    codes = rec.prompt_domain[idx]
    raw = eta_squared_reps(eng.boot, idx, x[idx], codes, eng.G)
    domain = explained_share_reps(eng.boot, idx, rec.prompt_domain, x[idx], codes, eng.G)
    n = len(idx)
    return LevelShares(
        PROMPT,
        f"prompt's tokens per step ({tokens.label})",
        n,
        _estimate(eng, raw, n, n),
        _estimate(eng, domain, n, n),
        (
            Component("domain", _estimate(eng, domain, n, n)),
            Component(WITHIN_DOMAIN, _estimate(eng, 1 - domain, n, n)),
        ),
    )


def _relative(
    eng: Resampler, level: str, measure: str, sums: np.ndarray, counts: np.ndarray, n: np.ndarray
) -> tuple[DomainEffect, ...]:
    """Each domain's mean (``sums / counts``, (B + 1, G) replicates) against the others' mean."""
    means = ratio(sums, counts)
    prompts = np.bincount(eng.rec.prompt_domain, minlength=eng.G)
    out = []
    for g, label in enumerate(eng.rec.domains):
        others = np.delete(means, g, axis=1)
        if others.shape[1] == 0:
            continue
        other_mean = np.mean(others, axis=1)  # NaN if any other domain is empty in a resample
        n_all, p_all = int(n.sum()), int(prompts.sum())
        out.append(
            DomainEffect(
                level,
                measure,
                label,
                eng.boot.estimate(means[:, g], int(n[g]), int(prompts[g]), 1),
                _estimate(eng, other_mean, n_all - int(n[g]), p_all - int(prompts[g])),
                _estimate(eng, ratio(means[:, g], other_mean) - 1, n_all, p_all),
            )
        )
    return tuple(out)


def _effects(eng: Resampler, tokens: PromptTokens) -> tuple[DomainEffect, ...]:
    rec = eng.rec
    steps = rec.steps
    G, P = eng.G, rec.n_prompts
    onehot = np.zeros((P, G))
    onehot[np.arange(P), rec.prompt_domain] = 1.0
    per_prompt = np.column_stack(
        [
            np.bincount(steps.prompt, weights=steps.tau.astype(float), minlength=P),
            np.bincount(steps.prompt, minlength=P),
        ]
    )
    t = eng.boot.total(onehot[:, :, None] * per_prompt[:, None, :])  # (B + 1, G, 2)
    step_n = t[0, :, 1]
    by_step = _relative(eng, STEP, f"tau ({POSITION_MEAN})", t[..., 0], t[..., 1], step_n)
    x = _checked(eng, tokens)
    has = np.isfinite(x)
    s = eng.boot.total(onehot * np.where(has, x, 0.0)[:, None])
    c = eng.boot.total(onehot * has[:, None])
    by_prompt = _relative(eng, PROMPT, f"prompt's tokens per step ({tokens.label})", s, c, c[0])
    return by_step + by_prompt


def budget_comparison(eng: Resampler) -> BudgetComparison:
    """Noise-corrected shares of domain and depth over the top-1 chain's eligible nodes."""
    rec = eng.rec
    nodes = rec.nodes
    edge = nodes.on_chain & nodes.eligible
    prompt, v = nodes.prompt[edge], nodes.greedy[edge]
    depth = nodes.depth[edge] - 1
    n_depths = int(depth.max()) + 1 if edge.any() else 0
    domain = explained_share_reps(eng.boot, prompt, rec.prompt_domain, v, nodes.domain[edge], eng.G)
    by_depth = explained_share_reps(eng.boot, prompt, rec.prompt_domain, v, depth, max(n_depths, 1))
    n, p = int(edge.sum()), len(np.unique(prompt))
    return BudgetComparison(
        n,
        p,
        n_depths,
        _estimate(eng, domain, n, p),
        _estimate(eng, by_depth, n, p),
        _estimate(eng, domain - by_depth, n, p),
    )


def level_effects(
    eng: Resampler, variance: VarianceDecomposition, tokens: PromptTokens | None = None
) -> LevelEffects:
    """The three levels of a run: ``variance`` is its node-level decomposition (the analysis'
    ``Analysis.variance``, or :func:`.effects.variance_decomposition` of ``eng``); ``tokens`` the
    prompt level's tokens per step (default: the position mean)."""
    tokens = tokens or position_mean_tokens(eng)
    rec = eng.rec
    counts = np.bincount(rec.prompt_domain, minlength=eng.G)
    return LevelEffects(
        tokens.label,
        _node_shares(variance) + (_step_shares(eng), _prompt_shares(eng, tokens)),
        _effects(eng, tokens),
        budget_comparison(eng),
        tuple((d, int(c)) for d, c in zip(rec.domains, counts)),
    )


# --- findings, each at a named level ---------------------------------------------------------------

# The level each of the paper's findings (:mod:`.findings`) is tested at.
FINDING_LEVELS = {
    "task_type_over_depth": "node (alpha)",
    "task_type_over_depth_greedy": "node (greedy acceptance)",
    "only_chat_above_one": "node means per depth (the paper's E[L])",
    "rises_with_depth": "node, within prompt",
    "rises_with_depth_top1_chain": "node on the top-1 chain, within prompt",
    "rises_with_depth_greedy_chain": "top-1-chain edge, within prompt",
    "rho_negative": "node",
    "rho_weak_range": "node",
    "chat_paradox": "node (domain means)",
    "below_one_no_speedup": "step (tau per recorded position)",
}
BUDGET_LEVEL = "top-1-chain edge (what a per-task speculation budget multiplies)"
BUDGET_KEY = "task_type_over_depth_budget"


@dataclass(frozen=True)
class LevelFinding:
    """A finding and the level it is tested at."""

    level: str
    finding: Finding


def finding_level(key: str) -> str:
    """The level a finding of :mod:`.findings` (or of this module) is tested at."""
    if key == BUDGET_KEY:
        return BUDGET_LEVEL
    for prefix, level in sorted(FINDING_LEVELS.items(), key=lambda kv: -len(kv[0])):
        if key.startswith(prefix):
            return level
    return "unknown"


def budget_finding(
    b: BudgetComparison, domain_prompts: tuple[tuple[str, int], ...], settings: Settings
) -> LevelFinding:
    """The verdict on "task type is a stronger predictor than depth" where per-task budgets act.

    The paper's implication is a speculation budget per task type: how far to draft for a
    request of a given domain. A budget drafts a chain and buys the tokens of its accepted
    prefix; drafting depth d adds ``prod_{k <= d} c_k`` expected tokens, with ``c_k`` the greedy
    acceptance of the top-1 chain's node at depth k given its parent path is accepted. A budget per
    task beats one per depth (a fixed chain length, or a cut-off that depends on depth) exactly
    when ``c`` varies more between domains than between depths. So the claim is tested on those
    nodes, the chain's edges: the noise-corrected share of their variance that domain explains
    minus the share depth explains (prompt-clustered resamples, noise correction of
    :func:`.stats.explained_share_reps`). Unlike the node-level test of :mod:`.findings`, sibling
    ranks (the tree's design) and nodes off the accepted path do not enter. Step- and prompt-level
    shares (:func:`level_effects`) say how much of tokens per step domain explains, but depth is
    not a property of a step or a prompt, so the comparison with depth is made here.

    Verdict by the rules of :mod:`.findings`: holds if the difference is significantly above 0,
    does not hold if significantly below (one-sided, half of 1 - confidence each), inconclusive
    otherwise; not testable below ``settings.min_prompts`` prompts in a domain, with fewer than
    two domains or with a chain of one depth. Its false-positive rate is measured in
    ``tests/test_levels.py``.
    """
    claim = (
        "Task type is a stronger predictor than depth of the acceptance a speculation budget "
        "multiplies (greedy acceptance of a top-1-chain node given its parent is accepted)."
    )
    paper = "no effect size given; implication: per-task speculation budgets"
    measure = "noise-corrected η²(domain) − η²(depth), top-1-chain edges"
    figures = (("η² domain", b.domain), ("η² depth", b.depth), ("domain − depth", b.difference))
    detail = (
        f"{b.edges} edges of {b.prompts} prompts: domain {b.domain.format(4)}, "
        f"depth {b.depth.format(4)}"
    )
    why = None
    if len(domain_prompts) < 2 or b.depths < 2:
        why = "needs at least two domains and a top-1 chain of two depths"
    else:
        why = shortfall(domain_prompts, settings.min_prompts)
    verdict = Verdict.UNTESTABLE if why else one_sided_verdict(b.difference, settings.confidence)
    detail = f"{why}; {detail}" if why else detail
    finding = Finding(BUDGET_KEY, claim, paper, measure, b.difference, verdict, detail, figures)
    return LevelFinding(BUDGET_LEVEL, finding)
