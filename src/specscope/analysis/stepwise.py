"""Analysis of an ingested run (engine logs): what per-request speculation statistics can show.

Per domain: tokens per verify step (accepted drafts + the target's token), accepted drafts per
step and, where the engine logged what it drafted, the draft acceptance rate; each a ratio of sums
over prompts with an interval from the bootstrap that resamples prompts within domains (the
prompt is the unit of replication, as in every specscope analysis).

One finding is testable from step-level data: whether tokens per step differ between domains
(the step-level face of "task type matters"). It *holds* when some pair of domains differs
significantly (two-sided, Bonferroni over the pairs), else it is *inconclusive* (no test here can
show that domains are equal); it is *not testable* with fewer than two domains or fewer than
``min_prompts`` prompts in a domain. Its false-positive rate is measured on synthetic logs of
known truth in ``tests/serving/test_ingest.py`` (``lab.calibration.ingested_verdict_rate``). The
node-level tables and findings (alpha, entropy, depth, the acceptance vector) need node records
and are listed as unavailable.

Steps are verify steps (steps where something was drafted); requests that drafted nothing add
none and are counted apart. Where the engine logs no count and ingest derived it, the derivation
is printed beside the table. Where the run has a histogram (vLLM summary ``acceptance_histogram``,
SGLang ``spec_accept_histogram``, or per-step logs), each domain's distribution of accepted
drafts per step is tabulated, pooled over its steps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..files import make_dirs, write_json, write_output
from .render import markdown_escape
from .resampling import stratum_totals
from .stats import Estimate, interval_estimates, ratio

NODE_LEVEL = (
    "Tables I-VI (alpha, entropy, depth, sibling rank)",
    "acceptance vector",
    "the paper's findings on alpha, E[L], depth and entropy",
    "certificates",
)
CLAIM = "tokens per step differ between domains (task type matters)"


@dataclass(frozen=True)
class DomainStats:
    domain: str
    prompts: int
    steps: int
    tokens_per_step: Estimate
    accepted_per_step: Estimate
    draft_acceptance: Estimate | None  # accepted / drafted, where drafted was logged
    drafting: int = 0  # requests with at least one verify step


@dataclass(frozen=True)
class StepDistribution:
    """A domain's verify steps by accepted drafts: ``shares[j]`` of its ``steps`` accepted j."""

    domain: str
    steps: int
    shares: tuple[float, ...]


@dataclass(frozen=True)
class StepwiseFinding:
    claim: str
    verdict: str  # holds, inconclusive, not testable
    detail: str


@dataclass(frozen=True)
class StepwiseAnalysis:
    engine_format: str
    domains: tuple[DomainStats, ...]
    finding: StepwiseFinding
    unavailable: tuple[str, ...] = NODE_LEVEL
    engine: str = ""  # engine and version as the manifest records them
    derived: tuple[tuple[str, str], ...] = ()  # (count, how ingest derived it)
    distributions: tuple[StepDistribution, ...] = ()

    def to_markdown(self) -> str:
        title = (
            f"# Ingested run ({self.engine_format} logs{', ' + self.engine if self.engine else ''})"
        )
        lines = [
            title,
            "",
            "| domain | prompts | drafting | verify steps | tokens/step | accepted/step "
            "| draft acceptance |",
            "|---|---:|---:|---:|---|---|---|",
        ]
        for d in self.domains:
            acc = d.draft_acceptance.format(3) if d.draft_acceptance else "not logged"
            lines.append(
                f"| {markdown_escape(d.domain)} | {d.prompts} | {d.drafting} | {d.steps} "
                f"| {d.tokens_per_step.format(3)} | {d.accepted_per_step.format(3)} | {acc} |"
            )
        lines += [
            f"\nDerived, not logged: {name} = {markdown_escape(how)}." for name, how in self.derived
        ]
        if self.distributions:
            width = max(len(d.shares) for d in self.distributions)
            lines += [
                "",
                "Verify steps by accepted drafts (share of the domain's steps, pooled):",
                "",
                "| domain | steps | " + " | ".join(f"{j}" for j in range(width)) + " |",
                "|---|---:|" + "---:|" * width,
            ]
            for d in self.distributions:
                cells = [f"{x:.3f}" for x in d.shares] + ["0.000"] * (width - len(d.shares))
                lines.append(
                    f"| {markdown_escape(d.domain)} | {d.steps} | " + " | ".join(cells) + " |"
                )
        lines += [
            "",
            f"Finding: {self.finding.claim}: **{self.finding.verdict}** ({self.finding.detail})",
            "",
            "Unavailable from engine logs (they need node records, `specscope run`): "
            + "; ".join(self.unavailable)
            + ".",
        ]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict:
        def est(e: Estimate | None):
            return None if e is None else {"value": e.value, "lo": e.lo, "hi": e.hi, "se": e.se}

        return {
            "engine_format": self.engine_format,
            "engine": self.engine,
            "derived": dict(self.derived),
            "step_distributions": {
                d.domain: {"steps": d.steps, "shares": list(d.shares)} for d in self.distributions
            },
            "domains": [
                {
                    "domain": d.domain,
                    "prompts": d.prompts,
                    "drafting": d.drafting,
                    "steps": d.steps,
                    "tokens_per_step": est(d.tokens_per_step),
                    "accepted_per_step": est(d.accepted_per_step),
                    "draft_acceptance": est(d.draft_acceptance),
                }
                for d in self.domains
            ],
            "finding": vars(self.finding),
            "unavailable": list(self.unavailable),
        }


def domain_difference(
    varies: bool, requests: pd.DataFrame, estimates: dict, min_prompts: int, confidence: float
) -> StepwiseFinding:
    """The calibrated test of :data:`CLAIM` (see the module docstring); ``estimates``: each
    domain's (B + 1,) replicates, ``varies``: whether any resample differs from the sample."""
    counts = requests.groupby("domain")["prompt_id"].nunique()
    if len(counts) < 2:
        return StepwiseFinding(CLAIM, "not testable", "the run has one domain")
    if counts.min() < min_prompts:
        return StepwiseFinding(
            CLAIM,
            "not testable",
            f"{counts.idxmin()} has {counts.min()} prompts, fewer than {min_prompts}",
        )
    pairs = list(itertools.combinations(sorted(estimates), 2))
    level = (1 - confidence) / 2 / len(pairs)
    significant = []
    for a, b in pairs:
        diff = _estimate(
            estimates[a] - estimates[b],
            varies,
            confidence,
            prompts=int(counts[a] + counts[b]),
            strata=2,
        )
        if min(diff.p_above(0), diff.p_below(0)) < level:
            significant.append(f"{a} - {b} = {diff.format(3, signed=True)}")
    if significant:
        return StepwiseFinding(CLAIM, "holds", "; ".join(significant))
    return StepwiseFinding(
        CLAIM, "inconclusive", f"no pair of {len(counts)} domains differs significantly"
    )


def _estimate(
    reps: np.ndarray, varies: bool, confidence: float, prompts: int, strata: int = 1
) -> Estimate:
    return interval_estimates(
        np.asarray(reps, dtype=float)[:, None], varies, confidence, prompts=prompts, strata=strata
    )[0]


def step_distributions(histogram: pd.DataFrame | None) -> tuple[StepDistribution, ...]:
    """Each domain's verify steps by accepted drafts, from a histogram table (prompt_id, domain,
    accepted_len, steps)."""
    if histogram is None or histogram.empty:
        return ()
    out = []
    for domain, rows in histogram.groupby("domain", sort=True):
        counts = rows.groupby("accepted_len")["steps"].sum()
        total = int(counts.sum())
        shares = np.zeros(int(counts.index.max()) + 1)
        shares[counts.index.to_numpy(int)] = counts.to_numpy(float) / total
        out.append(StepDistribution(str(domain), total, tuple(float(x) for x in shares)))
    return tuple(out)


def _engine(manifest: dict) -> str:
    engine = manifest.get("engine") or ""
    version = manifest.get("engine_version")
    return f"{engine} {version}" if engine and version else engine


def analyze_ingested(
    manifest: dict,
    requests: pd.DataFrame,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    min_prompts: int = 10,
    histogram: pd.DataFrame | None = None,
) -> StepwiseAnalysis:
    """Each domain's figures, bootstrapped in chunks (:func:`stratum_totals`): memory does not
    grow with the number of requests beyond their columns. ``histogram``: the run's histogram
    table, if it has one."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    requests = requests.sort_values(["domain", "prompt_id"], kind="stable").reset_index(drop=True)
    columns = ["steps", "accepted"] + (["drafted"] if "drafted" in requests else [])
    values = requests[columns].to_numpy(float)
    domains = requests["domain"].to_numpy()
    boot = stratum_totals(domains, values, n_boot, seed)
    rows, tps = [], {}
    for g, domain in enumerate(boot.strata):
        keep = domains == domain
        s, a = boot.totals[:, g, 0], boot.totals[:, g, 1]
        n, varies = int(keep.sum()), bool(boot.varies[g])
        tps[domain] = ratio(a + s, s)
        acc_rate = None
        if "drafted" in columns and np.isfinite(values[keep, 2]).all():
            acc_rate = _estimate(ratio(a, boot.totals[:, g, 2]), varies, confidence, n)
        rows.append(
            DomainStats(
                domain,
                n,
                int(values[keep, 0].sum()),
                _estimate(tps[domain], varies, confidence, n),
                _estimate(ratio(a, s), varies, confidence, n),
                acc_rate,
                int((values[keep, 0] > 0).sum()),
            )
        )
    drafted = {
        r.domain for r in rows if r.steps > 0
    }  # a domain without verify steps has no tokens/step
    finding = domain_difference(
        bool(boot.varies.any()),
        requests[requests["domain"].isin(drafted)],
        {d: tps[d] for d in drafted},
        min_prompts,
        confidence,
    )
    if len(drafted) < len(rows) and finding.verdict == "not testable" and len(drafted) < 2:
        finding = StepwiseFinding(
            CLAIM, "not testable", f"{len(drafted)} of {len(rows)} domains drafted anything"
        )
    derived = manifest.get("derived") if isinstance(manifest.get("derived"), dict) else {}
    return StepwiseAnalysis(
        manifest.get("engine_format", "?"),
        tuple(rows),
        finding,
        engine=_engine(manifest),
        derived=tuple((str(k), str(v)) for k, v in sorted(derived.items())),
        distributions=step_distributions(histogram),
    )


def write_ingested_analysis(a: StepwiseAnalysis, out_dir: Path) -> tuple[Path, Path]:
    """tables.md and analysis.json (strict JSON: an undefined figure is null) in ``out_dir``,
    each written whole, never through a link planted there."""
    out_dir = Path(out_dir)
    make_dirs(out_dir)
    md, js = out_dir / "tables.md", out_dir / "analysis.json"
    write_output(md, a.to_markdown(), inside=out_dir)
    write_json(js, a.to_dict(), inside=out_dir)
    return md, js
