"""Whether a pattern is real: within-prompt depth deltas, the depth profile by sibling rank and
along the top-1 chain, effect sizes (domain vs depth vs prompt), the chat paradox, and binned
profiles by entropy and position.
"""

from __future__ import annotations

import math

import numpy as np

from specscope.analysis.prepare import ALL
from specscope.analysis.results import (
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
)
from specscope.analysis.stats import (
    eta_squared_prompt_reps,
    eta_squared_reps,
    explained_share_reps,
    ratio,
)

from specscope.analysis.resampling import Resampler, depth_keys


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
    n = np.append([counts[has & (rec.prompt_domain == g)].sum() for g in range(eng.G)],
                  counts[has].sum())
    return eng.boot.estimates(ratio(num, den), n, prompts, strata)


def depth_profile(eng: Resampler) -> DepthProfile:
    rec = eng.rec
    nodes = rec.nodes
    labels = rec.domains + (ALL,)
    depth = depth_keys(rec)
    rank = ((nodes.rank, rec.n_ranks),)
    rows = []
    everything = np.ones(len(nodes), bool)
    for metric, values, base in (("alpha", nodes.alpha, everything),
                                 (CONDITIONAL, nodes.greedy, nodes.eligible)):
        blocks = [("all nodes", eng.cells(values, depth, base), None, base)]
        by_rank = eng.cells(values, depth + rank, base)
        blocks += [(f"sibling rank {r}", by_rank, r, base & (nodes.rank == r))
                   for r in range(rec.n_ranks)]
        chain = base & nodes.on_chain
        blocks.append(("top-1 chain", eng.cells(values, depth, chain), None, chain))
        for name, cells, r, subset in blocks:
            pick = (lambda x: x) if r is None else (lambda x, r=r: x[..., r])
            m_e = eng.boot.estimates(pick(cells.mean), pick(cells.n), pick(cells.prompts),
                                     pick(cells.strata))
            d_e = within_prompt_delta(eng, values, subset)
            rows += [DepthProfileRow(lab, name, metric, tuple(m_e[g]), d_e[g])
                     for g, lab in enumerate(labels)]
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
        reps[metric] = {name: eta_squared_reps(eng.boot, prompt, v, codes, size)
                        for name, (codes, size) in factors.items()}
        reps[metric]["prompt"] = eta_squared_prompt_reps(eng.boot, prompt, v)
        for name in ("domain", "depth"):
            codes, size = factors[name]
            reps[metric][f"{name} (noise-corrected)"] = explained_share_reps(
                eng.boot, prompt, rec.prompt_domain, v, codes, size)
        reps[metric][DOMAIN_MINUS_DEPTH] = (reps[metric]["domain (noise-corrected)"]
                                            - reps[metric]["depth (noise-corrected)"])
    n, p = len(nodes), rec.n_prompts
    rows = tuple(EffectRow(name, eng.boot.estimate(reps["alpha"][name], n, p, eng.G),
                           eng.boot.estimate(reps["greedy"][name], n, p, eng.G))
                 for name in reps["alpha"])
    return EffectSizes(rows)


def paradox_check(eng: Resampler, entropy: np.ndarray, alpha: np.ndarray,
                  greedy: np.ndarray) -> ParadoxCheck | None:
    """Leads of one domain over the best other domain, in entropy and acceptance."""
    rec = eng.rec
    entropy, alpha, greedy = entropy[:, :-1], alpha[:, :-1], greedy[:, :-1]  # drop All
    live = np.flatnonzero(np.isfinite(entropy[0]))
    if len(live) < 2:
        return None
    names = [rec.domains[i] for i in live]
    entropy, alpha, greedy = entropy[:, live], alpha[:, live], greedy[:, live]
    top = {k: names[int(np.argmax(m[0]))]
           for k, m in (("entropy", entropy), ("alpha", alpha), ("greedy", greedy))}
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
        pairwise.append(PairLead(names[j], *(eng.boot.estimate(m[:, i] - m[:, j], n_ij, p_ij, 2)
                                             for m in (entropy, alpha, greedy))))
    return ParadoxCheck(names[i], top["entropy"], top["alpha"], top["greedy"], *leads, p_both,
                        tuple(pairwise))


def _profile(eng: Resampler, name: str, axis: str, codes: np.ndarray, n_bins: int,
             labels: tuple[str, ...], centers: tuple[float, ...]) -> BinnedProfile:
    rec = eng.rec
    rows = []
    for metric, v in (("alpha", rec.nodes.alpha), ("greedy_accept", rec.nodes.greedy)):
        cells = eng.cells(v, ((codes, n_bins),))
        est = eng.estimates(cells.mean, cells)
        rows += [ProfileRow(lab, metric, tuple(est[g]))
                 for g, lab in enumerate(rec.domains + (ALL,))]
    return BinnedProfile(name, axis, labels, centers, tuple(rows))


def entropy_profile(eng: Resampler) -> BinnedProfile:
    h = eng.rec.nodes.entropy
    edges = np.unique(np.quantile(h, np.linspace(0, 1, eng.settings.entropy_bins + 1)))
    if len(edges) < 2:
        edges = np.array([h.min(), h.min() + 1e-9])
    n_bins = len(edges) - 1
    codes = np.clip(np.searchsorted(edges, h, side="right") - 1, 0, n_bins - 1)
    centers = tuple(float(c) for c in ratio(np.bincount(codes, h, minlength=n_bins),
                                             np.bincount(codes, minlength=n_bins)))
    labels = tuple(f"{edges[i]:.2f}–{edges[i + 1]:.2f}" for i in range(n_bins))
    return _profile(eng, "entropy", "target entropy (nats)", codes, n_bins, labels, centers)


def position_profile(eng: Resampler) -> BinnedProfile:
    size = eng.settings.position_bucket
    codes = eng.rec.nodes.step // size
    n_bins = int(codes.max()) + 1
    labels = tuple(f"{b * size + 1}–{(b + 1) * size}" for b in range(n_bins))
    centers = tuple(b * size + (size + 1) / 2 for b in range(n_bins))
    return _profile(eng, "position", "output token position", codes, n_bins, labels, centers)


