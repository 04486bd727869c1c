"""Whether a pattern is real: within-prompt depth deltas, the depth profile by sibling rank and
along the top-1 chain, effect sizes (domain vs depth vs prompt), the variance decomposition of
acceptance over domain, prompt, sibling rank, depth and position, the chat paradox, and binned
profiles by entropy and position.

It also names the node-level factors a run can be stratified by (:data:`STRATIFIERS`); the
stratified analysis itself is :func:`specscope.analysis.tables.stratify`. Nothing here decides a
verdict (that is :mod:`.findings`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import SpecscopeError
from .prepare import ALL, Records
from .resampling import Resampler, depth_keys
from .results import (
    CONDITIONAL,
    DOMAIN_MINUS_DEPTH,
    BinnedProfile,
    DepthProfile,
    DepthProfileRow,
    EffectRow,
    EffectSizes,
    PairLead,
    ParadoxCheck,
    ProfileRow,
    VarianceDecomposition,
    VarianceRow,
)
from .stats import (
    ClusterBootstrap,
    eta_squared_prompt_reps,
    eta_squared_reps,
    explained_share_reps,
    ratio,
)


def within_prompt_delta(eng: Resampler, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Estimates (G + 1,) of the mean over prompts of (mean at depth D - mean at depth 1).

    Each prompt is compared with itself, so a depth trend cannot come from prompts that
    contribute more nodes at one depth than at another (e.g. easy prompts, whose parents are
    accepted more often, dominating the conditional rate at depth D). Prompts without nodes at
    both depths are left out.
    """
    rec = eng.rec
    nodes = rec.nodes
    P, D = rec.n_prompts, rec.max_depth
    if D < 2:
        return eng.boot.estimates(np.full((eng.boot.n_boot + 1, eng.G + 1), np.nan))
    idx = nodes.prompt[mask] * D + nodes.depth[mask] - 1
    sums = np.bincount(idx, weights=values[mask], minlength=P * D).reshape(P, D)
    counts = np.bincount(idx, minlength=P * D).reshape(P, D)
    has = (counts[:, 0] > 0) & (counts[:, -1] > 0)
    delta = np.where(has, ratio(sums[:, -1], counts[:, -1]) - ratio(sums[:, 0], counts[:, 0]), 0.0)
    onehot = np.zeros((P, eng.G))
    onehot[np.arange(P), rec.prompt_domain] = 1.0
    num = eng.boot.total(onehot * delta[:, None])
    den = eng.boot.total(onehot * has[:, None])
    num = np.concatenate([num, num.sum(axis=1, keepdims=True)], axis=1)
    den = np.concatenate([den, den.sum(axis=1, keepdims=True)], axis=1)
    per_domain = (onehot * has[:, None]).sum(axis=0)
    prompts = np.append(per_domain, per_domain.sum())
    strata = np.append(np.minimum(per_domain, 1), (per_domain > 0).sum())
    n = np.append(
        [counts[has & (rec.prompt_domain == g)].sum() for g in range(eng.G)], counts[has].sum()
    )
    return eng.boot.estimates(ratio(num, den), n, prompts, strata)


def depth_profile(eng: Resampler) -> DepthProfile:
    rec = eng.rec
    nodes = rec.nodes
    labels = rec.domains + (ALL,)
    depth = depth_keys(rec)
    rank = ((nodes.rank, rec.n_ranks),)
    rows = []
    everything = np.ones(len(nodes), bool)
    for metric, values, base in (
        ("alpha", nodes.alpha, everything),
        (CONDITIONAL, nodes.greedy, nodes.eligible),
    ):
        blocks = [("all nodes", eng.cells(values, depth, base), None, base)]
        by_rank = eng.cells(values, depth + rank, base)
        blocks += [
            (f"sibling rank {r}", by_rank, r, base & (nodes.rank == r)) for r in range(rec.n_ranks)
        ]
        chain = base & nodes.on_chain
        blocks.append(("top-1 chain", eng.cells(values, depth, chain), None, chain))
        for name, cells, r, subset in blocks:
            pick = (lambda x: x) if r is None else (lambda x, r=r: x[..., r])
            m_e = eng.boot.estimates(
                pick(cells.mean), pick(cells.n), pick(cells.prompts), pick(cells.strata)
            )
            d_e = within_prompt_delta(eng, values, subset)
            rows += [
                DepthProfileRow(lab, name, metric, tuple(m_e[g]), d_e[g])
                for g, lab in enumerate(labels)
            ]
    return DepthProfile(tuple(range(1, rec.max_depth + 1)), tuple(rows))


def effect_sizes(eng: Resampler) -> EffectSizes:
    """Raw eta^2 per factor (descriptive), then the noise-corrected shares of domain and depth
    and their difference, which the domain-vs-depth finding tests."""
    rec = eng.rec
    nodes = rec.nodes
    prompt = nodes.prompt
    factors = {
        "domain": (nodes.domain, eng.G),
        "depth": (nodes.depth - 1, rec.max_depth),
        "sibling rank": (nodes.rank, rec.n_ranks),
        "position bin": (nodes.position_bin, rec.n_bins),
    }
    reps: dict[str, dict[str, np.ndarray]] = {}
    for metric, v in (("alpha", nodes.alpha), ("greedy", nodes.greedy)):
        reps[metric] = {
            name: eta_squared_reps(eng.boot, prompt, v, codes, size)
            for name, (codes, size) in factors.items()
        }
        reps[metric]["prompt"] = eta_squared_prompt_reps(eng.boot, prompt, v)
        for name in ("domain", "depth"):
            codes, size = factors[name]
            reps[metric][f"{name} (noise-corrected)"] = explained_share_reps(
                eng.boot, prompt, rec.prompt_domain, v, codes, size
            )
        reps[metric][DOMAIN_MINUS_DEPTH] = (
            reps[metric]["domain (noise-corrected)"] - reps[metric]["depth (noise-corrected)"]
        )
    n, p = len(nodes), rec.n_prompts
    rows = tuple(
        EffectRow(
            name,
            eng.boot.estimate(reps["alpha"][name], n, p, eng.G),
            eng.boot.estimate(reps["greedy"][name], n, p, eng.G),
        )
        for name in reps["alpha"]
    )
    return EffectSizes(rows)


def paradox_check(
    eng: Resampler, entropy: np.ndarray, alpha: np.ndarray, greedy: np.ndarray
) -> ParadoxCheck | None:
    """Leads of one domain over the best other domain, in entropy and acceptance."""
    rec = eng.rec
    entropy, alpha, greedy = entropy[:, :-1], alpha[:, :-1], greedy[:, :-1]  # drop All
    live = np.flatnonzero(np.isfinite(entropy[0]))
    if len(live) < 2:
        return None
    names = [rec.domains[i] for i in live]
    entropy, alpha, greedy = entropy[:, live], alpha[:, live], greedy[:, live]
    top = {
        k: names[int(np.argmax(m[0]))]
        for k, m in (("entropy", entropy), ("alpha", alpha), ("greedy", greedy))
    }
    i = names.index("chat") if "chat" in names else names.index(top["entropy"])
    others = [j for j in range(len(names)) if j != i]

    def lead(m):
        return m[:, i] - np.nanmax(m[:, others], axis=1)

    counts = eng.cells(None)
    n, p = int(counts.n[live].sum()), int(counts.prompts[live].sum())
    leads = [eng.boot.estimate(lead(m), n, p, len(live)) for m in (entropy, alpha, greedy)]
    both = (lead(entropy)[1:] > 0) & (lead(alpha)[1:] > 0)
    p_both = float(both.mean()) if eng.boot.n_boot else math.nan
    pairwise = []
    for j in others:
        n_ij = int(counts.n[live[i]] + counts.n[live[j]])
        p_ij = int(counts.prompts[live[i]] + counts.prompts[live[j]])
        pairwise.append(
            PairLead(
                names[j],
                *(
                    eng.boot.estimate(m[:, i] - m[:, j], n_ij, p_ij, 2)
                    for m in (entropy, alpha, greedy)
                ),
            )
        )
    return ParadoxCheck(
        names[i], top["entropy"], top["alpha"], top["greedy"], *leads, p_both, tuple(pairwise)
    )


def _profile(
    eng: Resampler,
    name: str,
    axis: str,
    codes: np.ndarray,
    n_bins: int,
    labels: tuple[str, ...],
    centers: tuple[float, ...],
) -> BinnedProfile:
    rec = eng.rec
    rows = []
    for metric, v in (("alpha", rec.nodes.alpha), ("greedy_accept", rec.nodes.greedy)):
        cells = eng.cells(v, ((codes, n_bins),))
        est = eng.estimates(cells.mean, cells)
        rows += [
            ProfileRow(lab, metric, tuple(est[g])) for g, lab in enumerate(rec.domains + (ALL,))
        ]
    return BinnedProfile(name, axis, labels, centers, tuple(rows))


def entropy_profile(eng: Resampler) -> BinnedProfile:
    h = eng.rec.nodes.entropy
    edges = np.unique(np.quantile(h, np.linspace(0, 1, eng.settings.entropy_bins + 1)))
    if len(edges) < 2:
        edges = np.array([h.min(), h.min() + 1e-9])
    n_bins = len(edges) - 1
    codes = np.clip(np.searchsorted(edges, h, side="right") - 1, 0, n_bins - 1)
    centers = tuple(
        float(c)
        for c in ratio(
            np.bincount(codes, h, minlength=n_bins), np.bincount(codes, minlength=n_bins)
        )
    )
    labels = tuple(f"{edges[i]:.2f}–{edges[i + 1]:.2f}" for i in range(n_bins))
    return _profile(eng, "entropy", "target entropy (nats)", codes, n_bins, labels, centers)


def position_profile(eng: Resampler) -> BinnedProfile:
    size = eng.settings.position_bucket
    codes = eng.rec.nodes.step // size
    n_bins = int(codes.max()) + 1
    labels = tuple(f"{b * size + 1}–{(b + 1) * size}" for b in range(n_bins))
    centers = tuple(b * size + (size + 1) / 2 for b in range(n_bins))
    return _profile(eng, "position", "output token position", codes, n_bins, labels, centers)


# --- factors, the variance decomposition, stratifiers ---------------------------------------------


@dataclass(frozen=True)
class Factor:
    """A grouping of nodes: its codes 0..levels-1 in a run, and whether it is fixed per prompt."""

    name: str  # the records' column name
    prompt_level: bool  # the same for every node of a prompt (domain, prompt)
    codes: Callable[[Records], tuple[np.ndarray, int]]


FACTORS: dict[str, Factor] = {
    "domain": Factor("domain", True, lambda r: (r.nodes.domain, len(r.domains))),
    "prompt": Factor("prompt", True, lambda r: (r.nodes.prompt, r.n_prompts)),
    "sibling_rank": Factor("sibling_rank", False, lambda r: (r.nodes.rank, r.n_ranks)),
    "depth": Factor("depth", False, lambda r: (r.nodes.depth - 1, r.max_depth)),
    "position_bin": Factor("position_bin", False, lambda r: (r.nodes.position_bin, r.n_bins)),
}
WITHIN_PROMPT = ("sibling_rank", "depth", "position_bin")  # the decomposition's order after prompt
STRATIFIERS = WITHIN_PROMPT  # node-level factors a run can be stratified by


class StratifyError(SpecscopeError, ValueError):
    """A stratification factor the run cannot be split by."""


def stratifiers(rec: Records) -> tuple[str, ...]:
    """The factors this run can be stratified by: node-level ones with more than one level."""
    return tuple(name for name in STRATIFIERS if FACTORS[name].codes(rec)[1] > 1)


def check_stratifier(rec: Records, name: str) -> str:
    """``name`` if the run can be stratified by it, else a StratifyError naming what is allowed."""
    allowed = stratifiers(rec)
    if name in allowed:
        return name
    listing = ", ".join(allowed + ("none",))
    if name in STRATIFIERS:
        raise StratifyError(
            f"cannot stratify by {name}: the run's nodes have a single {name}; allowed: {listing}"
        )
    raise StratifyError(
        f"cannot stratify by {name!r}: allowed: {listing} (node-level factors "
        f"with more than one level in this run)"
    )


def _dummies(codes: np.ndarray, levels: int) -> np.ndarray:
    """(N, levels - 1) indicators of levels 1.. (level 0 is the reference)."""
    return (codes[:, None] == np.arange(1, levels)[None, :]).astype(float)


def _within_ss(
    boot: ClusterBootstrap,
    prompt: np.ndarray,
    x: np.ndarray,
    z: np.ndarray,
    n_p: np.ndarray,
    s_p: np.ndarray,
) -> np.ndarray:
    """(B + 1,) sums of squares explained by the columns ``z`` beyond prompt fixed effects.

    The within-prompt least-squares fit (each prompt's mean removed from x and z), from
    per-prompt sums, so that every resample's fit is exact: ``b' A^+ b`` with
    ``A = sum_p w_p (Z_p'Z_p - Z_p'1 1'Z_p / n_p)`` and
    ``b = sum_p w_p (Z_p'x_p - Z_p'1 s_p / n_p)``.
    """
    P, k = boot.n_prompts, z.shape[1]
    if k == 0:
        return np.zeros(boot.n_boot + 1)

    def per_prompt(columns: np.ndarray) -> np.ndarray:
        return np.stack([np.bincount(prompt, weights=c, minlength=P) for c in columns.T], axis=1)

    zz = per_prompt((z[:, :, None] * z[:, None, :]).reshape(len(z), k * k)).reshape(P, k, k)
    z1 = per_prompt(z)
    zx = per_prompt(z * x[:, None])
    inv_n = np.nan_to_num(ratio(np.ones(P), n_p))
    A = boot.total(zz - z1[:, :, None] * z1[:, None, :] * inv_n[:, None, None])
    b = boot.total(zx - z1 * (s_p * inv_n)[:, None])
    coef = np.einsum("bij,bj->bi", np.linalg.pinv(A, hermitian=True), b)
    return np.einsum("bi,bi->b", coef, b)


def _decomposition_reps(eng: Resampler, x: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Replicates of the sequential and unique shares of each factor, for one metric."""
    rec = eng.rec
    boot = eng.boot
    prompt = rec.nodes.prompt
    x = np.asarray(x, dtype=float) - float(np.mean(x))
    P = rec.n_prompts
    n_p = np.bincount(prompt, minlength=P).astype(float)
    s_p = np.bincount(prompt, weights=x, minlength=P)
    q_p = np.bincount(prompt, weights=x * x, minlength=P)
    onehot = np.zeros((P, eng.G))
    onehot[np.arange(P), rec.prompt_domain] = 1.0
    per_prompt = np.column_stack(
        [
            n_p,
            s_p,
            q_p,
            np.nan_to_num(ratio(s_p**2, n_p)),
            onehot * n_p[:, None],
            onehot * s_p[:, None],
        ]
    )
    t = boot.total(per_prompt)
    G = eng.G
    n, s, q, between_p = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
    n_g, s_g = t[:, 4 : 4 + G], t[:, 4 + G : 4 + 2 * G]
    grand = ratio(s**2, n)
    total = q - grand
    ss_domain = np.nansum(ratio(s_g**2, n_g), axis=1) - grand
    ss_prompt = between_p - grand
    cols = {name: _dummies(*FACTORS[name].codes(rec)) for name in WITHIN_PROMPT}

    def within(names) -> np.ndarray:
        z = np.concatenate([cols[m] for m in names], axis=1) if names else np.zeros((len(x), 0))
        return _within_ss(boot, prompt, x, z, n_p, s_p)

    seq = {"domain": ss_domain, "prompt": ss_prompt - ss_domain}
    cumulative = np.zeros_like(total)
    for i, name in enumerate(WITHIN_PROMPT):
        ss = within(WITHIN_PROMPT[: i + 1])
        seq[name] = ss - cumulative
        cumulative = ss
    seq["residual"] = total - ss_prompt - cumulative
    unique = {
        name: cumulative - within([m for m in WITHIN_PROMPT if m != name]) for name in WITHIN_PROMPT
    }
    return {
        "sequential": {k: ratio(v, total) for k, v in seq.items()},
        "unique": {k: ratio(v, total) for k, v in unique.items()},
    }


def variance_decomposition(eng: Resampler) -> VarianceDecomposition:
    """Shares of the node-level variance of alpha and greedy acceptance explained by each factor.

    Three views per factor, each with a prompt-clustered interval from the analysis' resamples:
    the factor alone (raw eta^2, and noise-corrected as :func:`explained_share_reps` does for
    every factor but the prompt); sequential shares in the order domain, prompt within domain,
    sibling rank, depth, position bin (least squares with every earlier factor, prompt as fixed
    effects), which with the residual sum to 1; and the unique share of each within-prompt
    factor (what is lost when it is dropped from the full model).
    """
    rec = eng.rec
    nodes = rec.nodes
    n, p = len(nodes), rec.n_prompts
    order = ("domain", "prompt") + WITHIN_PROMPT
    rows = []
    for metric, v in (("alpha", nodes.alpha), ("greedy_accept", nodes.greedy)):
        reps = _decomposition_reps(eng, v)
        for name in order + ("residual",):
            if name == "residual":
                levels, one_way, corrected = 0, None, None
            else:
                codes, levels = FACTORS[name].codes(rec)
                if name == "prompt":
                    one_way = eta_squared_prompt_reps(eng.boot, nodes.prompt, v)
                    corrected = None
                else:
                    one_way = eta_squared_reps(eng.boot, nodes.prompt, v, codes, levels)
                    corrected = explained_share_reps(
                        eng.boot, nodes.prompt, rec.prompt_domain, v, codes, levels
                    )

            def est(r):
                if r is None:
                    return eng.boot.estimate(np.full(eng.boot.n_boot + 1, np.nan), n, p, eng.G)
                return eng.boot.estimate(r, n, p, eng.G)

            single = name != "residual" and levels < 2
            nan = None
            rows.append(
                VarianceRow(
                    metric,
                    name,
                    levels,
                    est(nan if single else one_way),
                    est(nan if single else corrected),
                    est(nan if single else reps["sequential"][name]),
                    est(reps["unique"].get(name) if not single else nan),
                )
            )
    return VarianceDecomposition(order, tuple(rows))
