"""The paper's Tables I-VI and the corrected metrics, computed with bootstrap intervals into the
typed results of :mod:`specscope.analysis.results`.

Every figure is computed for each domain and for all domains pooled (the row labelled "All"), with
a percentile interval from the prompt-clustered bootstrap of :mod:`specscope.analysis.stats`. The
whole analysis shares one weight matrix, so differences between figures (deltas, leads, the
domain-minus-depth effect) get intervals from the same resamples.

Definitions (docs/metrics.md; ``v`` is the acceptance metric, ``alpha`` for the paper's tables,
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
- the variance decomposition: shares of the variance of alpha and greedy acceptance explained by
  domain, prompt, sibling rank, depth and position bin, alone and in sequence;
- the chat paradox: does the domain with the highest entropy also have the highest acceptance?

Stratification (:func:`stratified_analysis`): the per-domain tables and the findings again within
each level of a node-level factor (by default the sibling rank, which drives acceptance far more
than domain or depth), each level analysed exactly like a whole run on the same prompt resamples.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pandas as pd

from .echo import echo_table
from .effects import (
    FACTORS,
    check_stratifier,
    depth_profile,
    effect_sizes,
    entropy_profile,
    paradox_check,
    position_profile,
    variance_decomposition,
)
from .findings import evaluate_findings, stratified_findings
from .prepare import ALL, NodeArrays, Records
from .resampling import Resampler, depth_keys
from .results import (
    AcceptanceCell,
    AcceptanceTable,
    Analysis,
    CorrelationRow,
    DepthRow,
    LengthRow,
    PaperTables,
    PositionRow,
    PromptRow,
    RunInfo,
    Settings,
    Stratification,
    StratumResult,
    SummaryRow,
    TauDistribution,
    TauDistributionRow,
    TauRow,
)
from .stats import (
    pearson_reps,
    ratio,
    spearman_reps,
)


def paper_tables(eng: Resampler, metric: str) -> tuple[PaperTables, dict]:
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
    table1 = tuple(
        SummaryRow(lab, int(c1.n[g]), mean_e[g], std_e[g], ent_e[g]) for g, lab in enumerate(labels)
    )

    # Tables II-IV
    cd = eng.cells(v, depth_keys(rec))
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
    c5 = eng.cells(v, depth_keys(rec) + ((rec.nodes.position_bin, rec.n_bins),))
    m5 = c5.mean  # (B + 1, G + 1, D, bins)
    m5_e = eng.estimates(m5, c5)
    d5 = m5[..., -1] - m5[..., 0] if rec.n_bins > 1 else np.full(m5.shape[:-1], np.nan)
    d5_e = eng.estimates(d5, c5)
    table5 = tuple(
        PositionRow(lab, d, tuple(m5_e[g, d - 1]), d5_e[g, d - 1])
        for g, lab in enumerate(labels)
        for d in depths
    )

    # Table VI
    rows6 = []
    for lab, mask, boot, prompt, strata in eng.groups():
        x, y = rec.nodes.entropy[mask], v[mask]
        n_g, p_g = int(mask.sum()), len(np.unique(prompt))
        rho = spearman_reps(boot, prompt, eng.ranked(lab, "entropy", x), y, eng.settings.rank_bins)
        r = pearson_reps(boot, prompt, x, y)
        rows6.append(
            CorrelationRow(
                lab, n_g, boot.estimate(rho, n_g, p_g, strata), boot.estimate(r, n_g, p_g, strata)
            )
        )

    tables = PaperTables(
        rec.run.manifest.get("run_id", str(rec.run.path)),
        metric,
        depths,
        bins,
        table1,
        table2,
        table3,
        table4,
        table5,
        tuple(rows6),
    )
    return tables, {"mean": c1.mean, "entropy": c_h.mean, "expected_length": el}


def tau_metrics(eng: Resampler, paper: PaperTables) -> tuple[tuple[TauRow, ...], TauDistribution]:
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
        rows.append(
            TauRow(
                lab,
                int(c_tau.n[g]),
                tau_e[g],
                chain_e[g],
                gain_e[g],
                paper.table2[g].expected_length,
                min_tau,
            )
        )

    taus = tuple(range(1, int(steps.tau.max()) + 1)) if len(steps) else ()
    dist_rows = []
    for g, lab in enumerate(labels):
        in_g = steps.domain == g if lab != ALL else np.ones(len(steps), bool)
        counts = np.bincount(steps.tau[in_g], minlength=len(taus) + 1)[1 : len(taus) + 1]
        total = int(in_g.sum())
        shares = tuple(float(c / total) if total else math.nan for c in counts)
        dist_rows.append(TauDistributionRow(lab, total, shares))
    return tuple(rows), TauDistribution(taus, tuple(dist_rows))


def acceptance_vector(eng: Resampler) -> AcceptanceTable:
    rec = eng.rec
    nodes = rec.nodes
    keys = depth_keys(rec) + ((nodes.rank, rec.n_ranks),)
    unc = eng.cells(nodes.greedy, keys)
    cond = eng.cells(nodes.greedy, keys, mask=nodes.eligible)
    unc_e, cond_e = eng.estimates(unc.mean, unc), eng.estimates(cond.mean, cond)
    labels = rec.domains + (ALL,)
    cells = tuple(
        AcceptanceCell(
            lab,
            d + 1,
            r,
            int(unc.n[g, d, r]),
            int(cond.n[g, d, r]),
            unc_e[g, d, r],
            cond_e[g, d, r],
        )
        for g, lab in enumerate(labels)
        for d in range(rec.max_depth)
        for r in range(rec.n_ranks)
        if unc.n[-1, d, r] > 0
    )
    return AcceptanceTable(tuple(range(1, rec.max_depth + 1)), tuple(range(rec.n_ranks)), cells)


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
        rows.append(
            PromptRow(
                pid,
                rec.domains[rec.prompt_domain[i]],
                str(getattr(row, "source", "") or ""),
                str(getattr(row, "prompt_text", "") or ""),
                str(getattr(row, "output_text", "") or ""),
                n_steps,
                float(per["mean"].get(i, math.nan)),
            )
        )
    return tuple(rows)


AUTO = "auto"  # stratify by sibling rank when the trees have more than one


def analyze_records(
    rec: Records, settings: Settings | None = None, stratify: str | None = AUTO
) -> Analysis:
    """Compute every table, metric and finding of one run's records.

    ``stratify``: a node-level factor (``effects.STRATIFIERS``) to repeat the per-domain tables
    and findings within each level of; "auto" (sibling rank when the trees have more than one),
    or None / "none" for no stratification. A factor the run lacks raises StratifyError.
    """
    settings = Settings() if settings is None else settings
    if stratify == AUTO:
        factor = "sibling_rank" if rec.n_ranks > 1 else None
    elif stratify is None or stratify == "none":
        factor = None
    else:
        factor = check_stratifier(rec, stratify)
    analysis = _analysis(rec, settings)
    if factor is None:
        return analysis
    return replace(analysis, stratification=stratified_analysis(rec, settings, factor))


def subset_records(rec: Records, mask: np.ndarray) -> Records:
    """The same run with only the nodes of ``mask`` (steps, prompts and shapes unchanged)."""
    nodes = NodeArrays(**{f.name: getattr(rec.nodes, f.name)[mask] for f in fields(NodeArrays)})
    return replace(rec, nodes=nodes, warnings=())


def stratified_analysis(rec: Records, settings: Settings, factor: str) -> Stratification:
    """Tables I and VI, the depth trend and the findings within each level of ``factor``.

    Every level is analysed like a whole run (the same prompt resamples, the same verdict rules);
    its findings are also evaluated at the level Bonferroni-corrected over the levels, which the
    stratified "does not hold" uses (:data:`.findings.STRATIFIED_RULE`).
    """
    codes, n_levels = FACTORS[factor].codes(rec)
    present = [lv for lv in range(n_levels) if (codes == lv).any()]
    strict = replace(settings, confidence=1 - (1 - settings.confidence) / max(len(present), 1))
    strata = []
    for lv in present:
        sub = _analysis(subset_records(rec, codes == lv), settings, stratum=f"{factor} {lv}")
        strict_findings = evaluate_findings(replace(sub, settings=strict))
        delta = tuple(
            (r.domain, r.delta)
            for r in sub.depth_profile.rows
            if r.subset == "all nodes" and r.metric == "alpha"
        )
        strata.append(
            StratumResult(
                sub.stratum,
                lv,
                sub.info.nodes,
                sub.info.domain_prompts,
                sub.paper.table1,
                sub.paper.table6,
                delta,
                sub.findings,
                strict_findings,
            )
        )
    combined = stratified_findings(
        factor, [(s.label, s.findings, s.strict_findings) for s in strata]
    )
    return Stratification(factor, tuple(strata), combined)


def _analysis(rec: Records, settings: Settings, stratum: str = "") -> Analysis:
    """Every table, metric and finding of some records (one level of a factor: ``stratum``)."""
    eng = Resampler(rec, settings)
    paper, reps = paper_tables(eng, "alpha")
    greedy, greedy_reps = paper_tables(eng, "greedy_accept")
    tau, tau_dist = tau_metrics(eng, paper)
    manifest = rec.run.manifest
    with_records = np.ones(rec.n_prompts, bool)
    if stratum:  # a level counts the prompts that have nodes in it
        with_records = np.bincount(rec.nodes.prompt, minlength=rec.n_prompts) > 0
    info = RunInfo(
        str(manifest.get("run_id", rec.run.path.name)),
        str(rec.run.path),
        str(manifest.get("status", "unknown")),
        len(rec.nodes),
        len(rec.steps),
        rec.n_prompts,
        rec.domains,
        rec.max_depth,
        manifest,
        tuple(
            int(c) for c in np.bincount(rec.prompt_domain[with_records], minlength=len(rec.domains))
        ),
    )
    analysis = Analysis(
        info=info,
        settings=settings,
        paper=paper,
        greedy=greedy,
        tau=tau,
        tau_distribution=tau_dist,
        acceptance_vector=acceptance_vector(eng),
        depth_profile=depth_profile(eng),
        effects=effect_sizes(eng),
        paradox=paradox_check(eng, reps["entropy"], reps["mean"], greedy_reps["mean"]),
        entropy_profile=entropy_profile(eng),
        position_profile=position_profile(eng),
        findings=(),
        prompts=() if stratum else prompt_rows(rec),
        warnings=rec.warnings,
        echo=None
        if stratum
        else echo_table(rec.prompt_ids, rec.prompt_domain, rec.domains, rec.run.prompts, eng.boot),
        variance=None if stratum else variance_decomposition(eng),
        stratum=stratum,
    )
    return replace(
        analysis,
        findings=evaluate_findings(analysis),
        warnings=analysis.warnings
        + small_sample_warnings(analysis)
        + (
            tuple(f"prompt echo: {w}" for w in analysis.echo.warnings)
            if analysis.echo is not None
            else ()
        ),
    )


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
        how = (
            f"specscope run --config {Path(a.info.path) / 'manifest.json'} --per-domain {need} "
            f"--out {a.info.path}-n{need}"
        )
    return (
        f"too few prompts for verdicts: {have} per domain, verdicts need {need} (below that "
        f"the tests rest on a handful of degrees of freedom and rarely detect even a real "
        f"effect; see docs/calibration.md); every finding is 'not testable'. To measure "
        f"enough: {how}",
    )
