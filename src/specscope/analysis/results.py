"""The typed results of an analysis: one frozen dataclass per table, each figure an
:class:`~specscope.analysis.stats.Estimate` with its interval. Computed by
:mod:`specscope.analysis.tables`; read by findings, rendering, plots and the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .echo import EchoTable
from .prepare import ALL
from .stats import Estimate, nan_estimate

CONDITIONAL = "greedy | parent accepted"


@dataclass(frozen=True)
class Settings:
    """How an analysis is computed; recorded with its results."""

    n_boot: int = 1000
    seed: int = 0
    confidence: float = 0.95
    rank_bins: int = 32  # rank bins per variable in the Spearman bootstrap
    entropy_bins: int = 10  # quantile bins of target entropy in the entropy profile
    position_bucket: int = 8  # generation steps per bucket in the position profile
    min_prompts: int = 10  # prompts per domain below which no verdict is given (calibrated)


# --- the paper's tables ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryRow:
    """Table I: one domain's node statistics."""

    domain: str
    nodes: int
    mean: Estimate
    std: Estimate
    target_entropy: Estimate


@dataclass(frozen=True)
class LengthRow:
    """Table II: the paper's expected accepted length E[L] of one domain."""

    domain: str
    expected_length: Estimate


@dataclass(frozen=True)
class DepthRow:
    """Tables III (cumulative products) and IV (means, delta from depth 1 to depth D)."""

    domain: str
    by_depth: tuple[Estimate, ...]
    delta: Estimate = field(default_factory=nan_estimate)


@dataclass(frozen=True)
class PositionRow:
    """Table V: mean acceptance at one depth per position bin, delta from first to last bin."""

    domain: str
    depth: int
    by_bin: tuple[Estimate, ...]
    delta: Estimate


@dataclass(frozen=True)
class CorrelationRow:
    """Table VI: entropy-acceptance correlation of one domain."""

    domain: str
    nodes: int
    spearman: Estimate
    pearson: Estimate


@dataclass(frozen=True)
class PaperTables:
    """The paper's Tables I-VI for one acceptance metric (``alpha`` or ``greedy_accept``)."""

    source: str  # a run id, or "paper"
    metric: str
    depths: tuple[int, ...]
    bins: tuple[int, ...]
    table1: tuple[SummaryRow, ...]
    table2: tuple[LengthRow, ...]
    table3: tuple[DepthRow, ...]
    table4: tuple[DepthRow, ...]
    table5: tuple[PositionRow, ...]
    table6: tuple[CorrelationRow, ...]

    def row(self, table: str, domain: str):
        """The row of ``table`` ("table1".."table6") for ``domain``, or None."""
        return next((r for r in getattr(self, table) if r.domain == domain), None)


# --- corrected metrics -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TauRow:
    """Realized tokens per target pass of one domain."""

    domain: str
    steps: int
    tau: Estimate  # mean tau = accepted_len + 1 of the recorded tree
    chain_tau: Estimate  # mean tau the top-1 chain alone would have given
    tree_gain: Estimate  # tau - chain_tau, over steps that have nodes
    paper_expected_length: Estimate  # the paper's E[L] (Table II), for comparison
    min_tau: int | None


@dataclass(frozen=True)
class TauDistributionRow:
    domain: str
    steps: int
    shares: tuple[float, ...]  # share of steps with tau = taus[i]


@dataclass(frozen=True)
class TauDistribution:
    taus: tuple[int, ...]
    rows: tuple[TauDistributionRow, ...]


@dataclass(frozen=True)
class AcceptanceCell:
    """Greedy acceptance at one (depth, sibling rank) of one domain."""

    domain: str
    depth: int
    rank: int
    nodes: int
    eligible: int  # nodes whose parent path is accepted
    unconditional: Estimate  # mean greedy_accept over all nodes of the cell
    conditional: Estimate  # mean greedy_accept over eligible nodes


@dataclass(frozen=True)
class AcceptanceTable:
    """The acceptance vector per domain with intervals (Table V); its point estimates for tuning
    are :class:`specscope.tune.acceptance.AcceptanceVector`."""

    depths: tuple[int, ...]
    ranks: tuple[int, ...]
    cells: tuple[AcceptanceCell, ...]

    def cell(self, domain: str, depth: int, rank: int) -> AcceptanceCell | None:
        return next(
            (c for c in self.cells if (c.domain, c.depth, c.rank) == (domain, depth, rank)), None
        )


@dataclass(frozen=True)
class DepthProfileRow:
    domain: str
    subset: str  # "all nodes", "sibling rank r", "top-1 chain"
    metric: str  # "alpha" or CONDITIONAL
    by_depth: tuple[Estimate, ...]
    delta: Estimate  # mean over prompts of the within-prompt difference, depth D minus depth 1


@dataclass(frozen=True)
class DepthProfile:
    depths: tuple[int, ...]
    rows: tuple[DepthProfileRow, ...]

    def row(self, domain: str, subset: str, metric: str) -> DepthProfileRow | None:
        return next(
            (r for r in self.rows if (r.domain, r.subset, r.metric) == (domain, subset, metric)),
            None,
        )


@dataclass(frozen=True)
class EffectRow:
    factor: str
    alpha: Estimate
    greedy: Estimate


@dataclass(frozen=True)
class EffectSizes:
    """Eta squared of node-level acceptance per factor; the last row is domain minus depth."""

    rows: tuple[EffectRow, ...]

    def row(self, factor: str) -> EffectRow | None:
        return next((r for r in self.rows if r.factor == factor), None)


DOMAIN_MINUS_DEPTH = "domain − depth (noise-corrected)"


@dataclass(frozen=True)
class VarianceRow:
    """One factor's share of the variance of one acceptance metric (node level)."""

    metric: str  # "alpha" or "greedy_accept"
    factor: str  # a key of effects.FACTORS, or "residual"
    levels: int  # levels the factor has in the run
    one_way: Estimate  # raw eta^2 of the factor alone
    corrected: Estimate  # noise-corrected eta^2 of the factor alone (NaN for the prompt)
    sequential: Estimate  # share added in the decomposition's order (the rows sum to 1)
    unique: Estimate  # share lost when the factor is dropped last (within-prompt factors)


@dataclass(frozen=True)
class VarianceDecomposition:
    """Shares of node-level variance of alpha and greedy acceptance explained by each factor."""

    order: tuple[str, ...]  # the sequential order (then the residual)
    rows: tuple[VarianceRow, ...]

    def row(self, metric: str, factor: str) -> VarianceRow | None:
        return next((r for r in self.rows if (r.metric, r.factor) == (metric, factor)), None)


@dataclass(frozen=True)
class StratumResult:
    """The tables and findings of one level of the stratification factor (e.g. sibling rank 1)."""

    label: str  # e.g. "sibling_rank 1"
    level: int
    nodes: int
    domain_prompts: tuple[int, ...]  # prompts with nodes at this level, per domain
    table1: tuple[SummaryRow, ...]  # mean alpha by domain within the level
    table6: tuple[CorrelationRow, ...]  # rho(target entropy, alpha) within the level
    depth_delta: tuple[tuple[str, Estimate], ...]  # within-prompt change of alpha, depth 1 -> D
    findings: tuple  # tuple[Finding, ...]: the paper's claims checked within the level
    strict_findings: tuple  # the same at the Bonferroni-corrected level over the strata


@dataclass(frozen=True)
class Stratification:
    """Every per-domain table and finding again within each level of one node-level factor."""

    factor: str  # a key of effects.STRATIFIERS
    strata: tuple[StratumResult, ...]
    findings: tuple  # tuple[StratifiedFinding, ...], see specscope.analysis.findings


@dataclass(frozen=True)
class PairLead:
    """The checked domain's mean minus one other domain's, per quantity."""

    other: str
    entropy: Estimate
    alpha: Estimate
    greedy: Estimate


@dataclass(frozen=True)
class ParadoxCheck:
    """Is the highest-entropy domain also the highest-acceptance one?"""

    domain: str  # the domain checked: chat when present, else the highest-entropy domain
    entropy_top: str
    alpha_top: str
    greedy_top: str
    entropy_lead: Estimate  # domain's mean entropy minus the highest other domain's
    alpha_lead: Estimate
    greedy_lead: Estimate
    p_both: float  # share of resamples in which the domain tops both entropy and alpha
    pairwise: tuple[PairLead, ...] = ()  # against each other domain (what the verdict tests)


@dataclass(frozen=True)
class ProfileRow:
    domain: str
    metric: str
    values: tuple[Estimate, ...]


@dataclass(frozen=True)
class BinnedProfile:
    """Mean acceptance per bin of some variable (target entropy, position in the generation)."""

    name: str
    axis: str
    labels: tuple[str, ...]
    centers: tuple[float, ...]
    rows: tuple[ProfileRow, ...]


@dataclass(frozen=True)
class PromptRow:
    prompt_id: str
    domain: str
    source: str
    prompt_text: str
    output_text: str
    steps: int
    mean_tau: float


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    path: str
    status: str
    nodes: int
    steps: int
    prompts: int
    domains: tuple[str, ...]
    max_depth: int
    manifest: dict
    domain_prompts: tuple[int, ...] = ()  # prompts with records, per domain (same order)


@dataclass(frozen=True)
class Analysis:
    """Everything ``specscope analyze`` computes for one run."""

    info: RunInfo
    settings: Settings
    paper: PaperTables  # Tables I-VI with alpha, as the paper defines them
    greedy: PaperTables  # the same with greedy_accept in place of alpha
    tau: tuple[TauRow, ...]
    tau_distribution: TauDistribution
    acceptance_vector: AcceptanceTable
    depth_profile: DepthProfile
    effects: EffectSizes
    paradox: ParadoxCheck | None
    entropy_profile: BinnedProfile
    position_profile: BinnedProfile
    findings: tuple  # tuple[Finding, ...], see specscope.analysis.findings
    prompts: tuple[PromptRow, ...]
    warnings: tuple[str, ...]
    echo: EchoTable | None = None  # share of output words copied from the prompt, per domain
    variance: VarianceDecomposition | None = None
    stratification: Stratification | None = None
    stratum: str = ""  # set when this analysis covers one level of a stratification factor
    # what the run delivers when decoded: a specscope.analysis.delivered.Delivered (decoded
    # tokens per step, effects at three levels, the predictor scorecard), set by its deliver();
    # typed loosely because that module builds on this one
    delivered: object | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        """Row labels: the domains, then All."""
        return self.info.domains + (ALL,)
