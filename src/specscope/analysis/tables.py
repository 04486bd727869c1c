"""The paper's Tables I-VI and the corrected metrics, computed with bootstrap intervals into the
typed results of :mod:`specscope.analysis.results`.

Every figure is computed for each domain and for all domains pooled (the row labelled "All"), with
a percentile interval from the prompt-clustered bootstrap of :mod:`specscope.analysis.stats`. The
whole analysis shares one weight matrix, so differences between figures (deltas, leads, the
domain-minus-depth effect) get intervals from the same resamples.

Definitions (README: "Records"; ``v`` is the acceptance metric, ``alpha`` for the paper's tables,
``greedy_accept`` for the same tables recomputed with what greedy verification accepts):

- Table I: per domain, node count, mean and sample standard deviation (ddof = 1) of ``v``, mean
  ``target_entropy``.
- Table II: the paper's E[L] = sum over d = 1..D of prod over k <= d of mean ``v`` at depth k.
- Table III: those cumulative products per depth.
- Table IV: mean ``v`` per depth, and the delta from depth 1 to depth D.
- Table V: mean ``v`` per depth and position bin (``step // 32``), and the delta from the first bin
  to the last. The paper's table is the "All" block.
- Table VI: Spearman rho (and Pearson r, which the released code computed) of ``target_entropy``
  and ``v`` over nodes.

Corrected metrics:

- realized mean ``tau`` per domain (tokens a greedy tree verifier emits per target pass, bonus
  token counted), and what the top-1 chain alone would have emitted;
- the acceptance vector: greedy acceptance by depth and sibling rank, *unconditional* (mean over
  all nodes of the cell) and *conditional* (mean over nodes whose parent path is accepted; roots
  always count) -- the conditional rate is the per-edge probability a Sequoia-style optimiser
  multiplies along a path;
- the depth profile split by sibling rank and along the top-1 chain: does "acceptance rises with
  depth" survive when the same kind of node is compared at every depth (a selection effect?);
- effect sizes: eta squared (variance share of node-level acceptance explained) of domain, depth,
  sibling rank, position bin and prompt, and domain minus depth;
- the chat paradox: does the domain with the highest entropy also have the highest acceptance?
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from specscope.analysis.prepare import ALL, Records
from specscope.analysis.results import (
    CONDITIONAL,
    DOMAIN_MINUS_DEPTH,
    AcceptanceCell,
    AcceptanceTable,
    Analysis,
    BinnedProfile,
    CorrelationRow,
    DepthProfile,
    DepthProfileRow,
    DepthRow,
    EffectRow,
    EffectSizes,
    LengthRow,
    PairLead,
    PaperTables,
    ParadoxCheck,
    PositionRow,
    ProfileRow,
    PromptRow,
    RunInfo,
    Settings,
    SummaryRow,
    TauDistribution,
    TauDistributionRow,
    TauRow,
)
from specscope.analysis.stats import (
    ClusterBootstrap,
    Ranked,
    eta_squared_prompt_reps,
    eta_squared_reps,
    explained_share_reps,
    pearson_reps,
    ratio,
    spearman_reps,
)

# --- computation -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Cells:
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


class _Resampler:
    """Shared state of one analysis: the records and one bootstrap weight matrix."""

    def __init__(self, records: Records, settings: Settings):
        self.rec = records
        self.settings = settings
        self.boot = ClusterBootstrap.draw(records.prompt_domain, settings.n_boot, settings.seed,
                                          settings.confidence)
        self.G = len(records.domains)
        self._ranked: dict[tuple[str, str], Ranked] = {}

    def ranked(self, group: str, name: str, values: np.ndarray) -> Ranked:
        """Ranks of a variable within a group, computed once per analysis."""
        key = (group, name)
        if key not in self._ranked:
            self._ranked[key] = Ranked.of(values, self.settings.rank_bins)
        return self._ranked[key]

    def cells(self, values: np.ndarray | None, keys: tuple = (), mask: np.ndarray | None = None,
              table: str = "nodes") -> _Cells:
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
        return _Cells(np.concatenate([t_sums, t_sums.sum(axis=1, keepdims=True)], axis=1),
                      np.concatenate([t_counts, t_counts.sum(axis=1, keepdims=True)], axis=1),
                      prompts, strata)

    def estimates(self, reps: np.ndarray, cells: _Cells) -> np.ndarray:
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


def _depth_keys(rec: Records) -> tuple:
    return ((rec.nodes.depth - 1, rec.max_depth),)


def paper_tables(eng: _Resampler, metric: str) -> tuple[PaperTables, dict]:
    """Tables I-VI for ``metric``; also returns the replicates the findings reuse."""
    rec = eng.rec
    v = rec.nodes.alpha if metric == "alpha" else rec.nodes.greedy
    labels = rec.domains + (ALL,)
    depths = tuple(range(1, rec.max_depth + 1))
    bins = tuple(range(rec.n_bins))

    # Table I
    c1 = eng.cells(v)
    c_sq = eng.cells(v * v)
    n = c1.counts
    var = (c_sq.mean - c1.mean**2) * ratio(n, n - 1)
    std = np.sqrt(np.clip(var, 0, None))
    c_h = eng.cells(rec.nodes.entropy)
    mean_e, std_e, ent_e = (eng.estimates(r, c1) for r in (c1.mean, std, c_h.mean))
    table1 = tuple(SummaryRow(lab, int(c1.n[g]), mean_e[g], std_e[g], ent_e[g])
                   for g, lab in enumerate(labels))

    # Tables II-IV
    cd = eng.cells(v, _depth_keys(rec))
    by_depth = cd.mean  # (B + 1, G + 1, D)
    cum = np.cumprod(by_depth, axis=-1)
    el = cum.sum(axis=-1)
    delta = by_depth[..., -1] - by_depth[..., 0]
    if rec.max_depth < 2:  # no depth to compare with
        delta = np.full_like(delta, np.nan)
    depth_e, cum_e = eng.estimates(by_depth, cd), eng.estimates(cum, cd)
    el_e, delta_e = eng.estimates(el, cd), eng.estimates(delta, cd)
    table2 = tuple(LengthRow(lab, el_e[g]) for g, lab in enumerate(labels))
    table3 = tuple(DepthRow(lab, tuple(cum_e[g])) for g, lab in enumerate(labels))
    table4 = tuple(DepthRow(lab, tuple(depth_e[g]), delta_e[g]) for g, lab in enumerate(labels))

    # Table V
    c5 = eng.cells(v, _depth_keys(rec) + ((rec.nodes.position_bin, rec.n_bins),))
    m5 = c5.mean  # (B + 1, G + 1, D, bins)
    m5_e = eng.estimates(m5, c5)
    d5 = m5[..., -1] - m5[..., 0] if rec.n_bins > 1 else np.full(m5.shape[:-1], np.nan)
    d5_e = eng.estimates(d5, c5)
    table5 = tuple(PositionRow(lab, d, tuple(m5_e[g, d - 1]), d5_e[g, d - 1])
                   for g, lab in enumerate(labels) for d in depths)

    # Table VI
    rows6 = []
    for lab, mask, boot, prompt, strata in eng.groups():
        x, y = rec.nodes.entropy[mask], v[mask]
        n_g, p_g = int(mask.sum()), len(np.unique(prompt))
        rho = spearman_reps(boot, prompt, eng.ranked(lab, "entropy", x), y,
                            eng.settings.rank_bins)
        r = pearson_reps(boot, prompt, x, y)
        rows6.append(CorrelationRow(lab, n_g, boot.estimate(rho, n_g, p_g, strata),
                                    boot.estimate(r, n_g, p_g, strata)))

    tables = PaperTables(rec.run.manifest.get("run_id", str(rec.run.path)), metric, depths, bins,
                         table1, table2, table3, table4, table5, tuple(rows6))
    return tables, {"mean": c1.mean, "entropy": c_h.mean, "expected_length": el}


def tau_metrics(eng: _Resampler, paper: PaperTables) -> tuple[tuple[TauRow, ...], TauDistribution]:
    rec = eng.rec
    steps = rec.steps
    labels = rec.domains + (ALL,)
    has_nodes = np.isfinite(steps.chain_len)
    tau = steps.tau.astype(np.float64)
    c_tau = eng.cells(tau, table="steps")
    c_chain = eng.cells(np.nan_to_num(steps.chain_len) + 1, mask=has_nodes, table="steps")
    c_matched = eng.cells(tau, mask=has_nodes, table="steps")
    tau_e = eng.estimates(c_tau.mean, c_tau)
    chain_e = eng.estimates(c_chain.mean, c_chain)
    gain_e = eng.estimates(c_matched.mean - c_chain.mean, c_chain)
    rows = []
    for g, lab in enumerate(labels):
        in_g = steps.domain == g if lab != ALL else np.ones(len(steps), bool)
        min_tau = int(steps.tau[in_g].min()) if in_g.any() else None
        rows.append(TauRow(lab, int(c_tau.n[g]), tau_e[g], chain_e[g], gain_e[g],
                           paper.table2[g].expected_length, min_tau))

    taus = tuple(range(1, int(steps.tau.max()) + 1)) if len(steps) else ()
    dist_rows = []
    for g, lab in enumerate(labels):
        in_g = steps.domain == g if lab != ALL else np.ones(len(steps), bool)
        counts = np.bincount(steps.tau[in_g], minlength=len(taus) + 1)[1:len(taus) + 1]
        total = int(in_g.sum())
        shares = tuple(float(c / total) if total else math.nan for c in counts)
        dist_rows.append(TauDistributionRow(lab, total, shares))
    return tuple(rows), TauDistribution(taus, tuple(dist_rows))


def acceptance_vector(eng: _Resampler) -> AcceptanceTable:
    rec = eng.rec
    nodes = rec.nodes
    keys = _depth_keys(rec) + ((nodes.rank, rec.n_ranks),)
    unc = eng.cells(nodes.greedy, keys)
    cond = eng.cells(nodes.greedy, keys, mask=nodes.eligible)
    unc_e, cond_e = eng.estimates(unc.mean, unc), eng.estimates(cond.mean, cond)
    labels = rec.domains + (ALL,)
    cells = tuple(
        AcceptanceCell(lab, d + 1, r, int(unc.n[g, d, r]), int(cond.n[g, d, r]),
                       unc_e[g, d, r], cond_e[g, d, r])
        for g, lab in enumerate(labels)
        for d in range(rec.max_depth) for r in range(rec.n_ranks)
        if unc.n[-1, d, r] > 0)
    return AcceptanceTable(tuple(range(1, rec.max_depth + 1)), tuple(range(rec.n_ranks)), cells)


def within_prompt_delta(eng: _Resampler, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
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


def depth_profile(eng: _Resampler) -> DepthProfile:
    rec = eng.rec
    nodes = rec.nodes
    labels = rec.domains + (ALL,)
    depth = _depth_keys(rec)
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


def effect_sizes(eng: _Resampler) -> EffectSizes:
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


def paradox_check(eng: _Resampler, entropy: np.ndarray, alpha: np.ndarray,
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


def _profile(eng: _Resampler, name: str, axis: str, codes: np.ndarray, n_bins: int,
             labels: tuple[str, ...], centers: tuple[float, ...]) -> BinnedProfile:
    rec = eng.rec
    rows = []
    for metric, v in (("alpha", rec.nodes.alpha), ("greedy_accept", rec.nodes.greedy)):
        cells = eng.cells(v, ((codes, n_bins),))
        est = eng.estimates(cells.mean, cells)
        rows += [ProfileRow(lab, metric, tuple(est[g]))
                 for g, lab in enumerate(rec.domains + (ALL,))]
    return BinnedProfile(name, axis, labels, centers, tuple(rows))


def entropy_profile(eng: _Resampler) -> BinnedProfile:
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


def position_profile(eng: _Resampler) -> BinnedProfile:
    size = eng.settings.position_bucket
    codes = eng.rec.nodes.step // size
    n_bins = int(codes.max()) + 1
    labels = tuple(f"{b * size + 1}–{(b + 1) * size}" for b in range(n_bins))
    centers = tuple(b * size + (size + 1) / 2 for b in range(n_bins))
    return _profile(eng, "position", "output token position", codes, n_bins, labels, centers)


def prompt_rows(rec: Records) -> tuple[PromptRow, ...]:
    steps = pd.DataFrame({"p": rec.steps.prompt, "tau": rec.steps.tau})
    per = steps.groupby("p")["tau"].agg(["size", "mean"])
    prompts = rec.run.prompts
    text = {}
    if len(prompts):
        for row in prompts.itertuples(index=False):
            text[str(row.prompt_id)] = row
    rows = []
    for i, pid in enumerate(rec.prompt_ids):
        row = text.get(pid)
        n_steps = int(per["size"].get(i, 0))
        rows.append(PromptRow(
            pid, rec.domains[rec.prompt_domain[i]],
            str(getattr(row, "source", "") or ""), str(getattr(row, "prompt_text", "") or ""),
            str(getattr(row, "output_text", "") or ""), n_steps,
            float(per["mean"].get(i, math.nan))))
    return tuple(rows)


def analyze_records(rec: Records, settings: Settings | None = None) -> Analysis:
    """Compute every table, metric and finding of one run's records."""
    from specscope.analysis.findings import evaluate_findings

    settings = Settings() if settings is None else settings
    eng = _Resampler(rec, settings)
    paper, reps = paper_tables(eng, "alpha")
    greedy, greedy_reps = paper_tables(eng, "greedy_accept")
    tau, tau_dist = tau_metrics(eng, paper)
    manifest = rec.run.manifest
    info = RunInfo(str(manifest.get("run_id", rec.run.path.name)), str(rec.run.path),
                   str(manifest.get("status", "unknown")), len(rec.nodes), len(rec.steps),
                   rec.n_prompts, rec.domains, rec.max_depth, manifest,
                   tuple(int(c) for c in np.bincount(rec.prompt_domain,
                                                     minlength=len(rec.domains))))
    analysis = Analysis(
        info=info, settings=settings, paper=paper, greedy=greedy, tau=tau,
        tau_distribution=tau_dist, acceptance_vector=acceptance_vector(eng),
        depth_profile=depth_profile(eng), effects=effect_sizes(eng),
        paradox=paradox_check(eng, reps["entropy"], reps["mean"], greedy_reps["mean"]),
        entropy_profile=entropy_profile(eng), position_profile=position_profile(eng),
        findings=(), prompts=prompt_rows(rec), warnings=rec.warnings)
    return replace(analysis, findings=evaluate_findings(analysis),
                   warnings=analysis.warnings + small_sample_warnings(analysis))


def small_sample_warnings(a: Analysis) -> tuple[str, ...]:
    """A warning, with the command that would measure enough, when verdicts cannot be given."""
    counts = dict(zip(a.info.domains, a.info.domain_prompts))
    need = a.settings.min_prompts
    if not counts or min(counts.values()) >= need:
        return ()
    have = ", ".join(f"{d} {n}" for d, n in counts.items())
    prompts = a.info.manifest.get("config", {}).get("prompts", {}) or {}
    if prompts.get("file"):
        how = f"add prompts to {prompts['file']} until every domain has {need}"
    else:
        how = (f"specscope run --config {Path(a.info.path) / 'manifest.json'} --per-domain {need} "
               f"--out {a.info.path}-n{need}")
    return (f"too few prompts for verdicts: {have} per domain, verdicts need {need} (below that "
            f"the tests rest on a handful of degrees of freedom and rarely detect even a real "
            f"effect; see the README's calibration); every finding is 'not testable'. To measure "
            f"enough: {how}",)
