"""The paper's findings, checked against a run: this run's figure, its interval, and a verdict.

A verdict is a claim about the world the prompts were drawn from, so every verdict comes from a
test whose error rates were measured on synthetic runs of known truth (``tests/test_calibration.py``
checks them; docs/calibration.md gives the table). The rules:

- The unit of replication is the prompt. Every figure's standard error comes from the bootstrap
  that resamples prompts within domains, and every test is a t test on it (:mod:`.stats`).
- *holds*: the run's figure is significantly on the claimed side (one-sided, at half of
  1 - confidence: the side of the two-sided interval shown). A claim about every domain must hold
  in each domain, which needs no correction (an intersection-union test).
- *does not hold*: some figure is significantly on the other side. A claim about every domain
  fails if it fails in any one, so those tests are Bonferroni-corrected for the number of domains
  (or comparisons) they span.
- *inconclusive*: neither.
- *not testable*: the run lacks what the claim needs (a chat domain, two depths), or has fewer
  than ``Settings.min_prompts`` prompts in a domain the claim involves: below that, intervals are
  too unreliable for a verdict (the calibration shows how unreliable).

Domain effects are compared across prompts (domain is a property of a prompt), depth trends within
prompts (each prompt compared with itself), and the domain-vs-depth claim on variance shares that
are corrected for sampling noise (raw eta^2 of a prompt-level factor absorbs prompt-to-prompt
variance and favours domain even when nothing differs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from .paper import paper_data
from .prepare import ALL
from .results import CONDITIONAL, DOMAIN_MINUS_DEPTH, Analysis
from .stats import Estimate, nan_estimate


class Verdict(str, Enum):
    HOLDS = "holds"
    FAILS = "does not hold"
    INCONCLUSIVE = "inconclusive"
    UNTESTABLE = "not testable"


LABELS = {
    "task_type_over_depth": "task type explains more of alpha than depth (noise-corrected η²)",
    "task_type_over_depth_greedy": "task type explains more of greedy acceptance than depth",
    "only_chat_above_one": "only chat has E[L] > 1",
    "rises_with_depth": "alpha rises with depth in every domain (all nodes, within prompts)",
    "rises_with_depth_top1_chain": "alpha rises with depth in every domain (top-1 chain)",
    "rises_with_depth_greedy_chain": "greedy | parent rises with depth (top-1 chain, within prompts)",
    "rho_negative": "ρ(entropy, alpha) < 0 in every domain",
    "rho_weak_range": "ρ(entropy, alpha) is weak (−0.3 to −0.1) in every domain",
    "chat_paradox": "chat has higher entropy and higher alpha than each other domain",
    "below_one_no_speedup": "E[L] < 1 means ≤ 1 token per target pass",
}

RULES = {
    "task_type_over_depth": "holds if the noise-corrected variance share of domain is significantly "
    "above depth's; does not hold if significantly below.",
    "only_chat_above_one": "holds if chat's E[L] is significantly above 1 and every other "
    "domain's significantly below; does not hold if chat is significantly "
    "below 1 or another domain significantly above (Bonferroni).",
    "rises_with_depth": "holds if the within-prompt change from depth 1 to the deepest depth is "
    "significantly positive in every domain; does not hold if significantly "
    "negative in any (Bonferroni over domains).",
    "rho_negative": "holds if ρ is significantly negative in every domain; does not hold if "
    "significantly positive in any (Bonferroni over domains).",
    "rho_weak_range": "holds if ρ is significantly inside [−0.3, −0.1] in every domain (two "
    "one-sided tests); does not hold if significantly outside in any "
    "(Bonferroni).",
    "chat_paradox": "holds if chat's entropy and alpha are each significantly above every other "
    "domain's; does not hold if either is significantly below any "
    "(Bonferroni over the comparisons).",
    "below_one_no_speedup": "tested in domains whose E[L] is significantly below 1: does not hold "
    "if their tokens per target pass (tau) is significantly above 1; "
    "holds if tau is exactly 1.",
}


@dataclass(frozen=True)
class Finding:
    key: str
    claim: str  # the paper's claim, in words
    paper: str  # the paper's own figure
    measure: str  # what this run's figure is
    estimate: Estimate  # the headline figure (pooled over domains where the claim is pooled)
    verdict: Verdict
    detail: str
    figures: tuple[tuple[str, Estimate], ...] = ()  # the figures the verdict is decided on

    def figures_text(self, digits: int = 3) -> str:
        """The figures the verdict uses, with intervals: "chat ρ 0.412 [0.31, 0.50]; ..."."""
        return figures_text(self.figures, digits)

    @property
    def label(self) -> str:
        """A short name of the claim, for narrow tables."""
        return LABELS.get(self.key, self.key)

    @property
    def rule(self) -> str:
        """How the verdict is decided, in one sentence."""
        for key, rule in RULES.items():
            if self.key.startswith(key):
                return rule
        return ""


@dataclass(frozen=True)
class _Test:
    """One-sided tests at the analysis' level: half of 1 - confidence, split over k tests."""

    alpha: float  # 1 - confidence

    def above(self, e: Estimate, x: float = 0.0, k: int = 1) -> bool:
        p = e.p_above(x)
        return p == p and p < self.alpha / (2 * k)

    def below(self, e: Estimate, x: float = 0.0, k: int = 1) -> bool:
        p = e.p_below(x)
        return p == p and p < self.alpha / (2 * k)

    def all_above(self, ests: Sequence[Estimate], x: float = 0.0) -> bool:  # intersection-union
        return bool(ests) and all(self.above(e, x) for e in ests)

    def all_below(self, ests: Sequence[Estimate], x: float = 0.0) -> bool:
        return bool(ests) and all(self.below(e, x) for e in ests)

    def any_above(self, ests: Sequence[Estimate], x: float = 0.0, k: int | None = None) -> bool:
        return any(self.above(e, x, k or len(ests)) for e in ests)  # Bonferroni

    def any_below(self, ests: Sequence[Estimate], x: float = 0.0, k: int | None = None) -> bool:
        return any(self.below(e, x, k or len(ests)) for e in ests)


def _test(a: Analysis) -> _Test:
    return _Test(1 - a.settings.confidence)


def _decide(holds: bool, fails: bool) -> Verdict:
    if fails:
        return Verdict.FAILS
    return Verdict.HOLDS if holds else Verdict.INCONCLUSIVE


def one_sided_verdict(e: Estimate, confidence: float, x: float = 0.0) -> Verdict:
    """The verdict on "the true value exceeds ``x``" from one figure, by the rules above: holds
    if it is significantly above ``x``, does not hold if significantly below (each test one-sided
    at half of 1 - ``confidence``), inconclusive otherwise; not testable without a standard
    error (too few prompts for an interval)."""
    if not e.testable:
        return Verdict.UNTESTABLE
    t = _Test(1 - confidence)
    return _decide(t.above(e, x), t.below(e, x))


def figures_text(figures: Sequence[tuple[str, Estimate]], digits: int = 3) -> str:
    """Named figures with their intervals, "; "-separated (differences signed); "—" if none."""
    return (
        "; ".join(
            f"{name} {e.format(digits, signed='−' in name or 'Δ' in name)}" for name, e in figures
        )
        or "—"
    )


def _listing(pairs: Sequence[tuple[str, Estimate]], signed: bool = False) -> str:
    return "; ".join(f"{name} {e.format(3, signed=signed)}" for name, e in pairs)


def _domains(a: Analysis) -> tuple[str, ...]:
    return tuple(r.domain for r in a.paper.table1 if r.domain != ALL and r.nodes > 0)


def shortfall(domain_prompts: tuple[tuple[str, int], ...], need: int) -> str | None:
    """Why a run with these prompts per domain is too small for a verdict, or None."""
    if not domain_prompts or min(n for _, n in domain_prompts) >= need:
        return None
    listing = ", ".join(f"{d} {n}" for d, n in domain_prompts)
    fewest = min(n for _, n in domain_prompts)
    return f"not testable: {fewest} prompts per domain ({listing}), need {need}"


def sample_shortfall(a: Analysis, domains: Sequence[str] | None = None) -> str | None:
    """Why the run has too few prompts for a verdict on ``domains`` (default: all), or None."""
    counts = dict(zip(a.info.domains, a.info.domain_prompts))
    domains = _domains(a) if domains is None else domains
    return shortfall(tuple((d, counts.get(d, 0)) for d in domains), a.settings.min_prompts)


def _untestable(
    key: str,
    claim: str,
    paper: str,
    measure: str,
    estimate: Estimate,
    why: str,
    detail: str = "",
    figures: Sequence[tuple[str, Estimate]] = (),
) -> Finding:
    return Finding(
        key,
        claim,
        paper,
        measure,
        estimate,
        Verdict.UNTESTABLE,
        why + (f"; {detail}" if detail else ""),
        tuple(figures),
    )


def _stratified_by(a: Analysis, *factors: str) -> str | None:
    """Why a claim about ``factors`` cannot be checked within one level of them, or None."""
    factor = a.stratum.split(" ")[0] if a.stratum else ""
    if factor in factors:
        return f"not testable within one {factor} (the claim is about {factor})"
    return None


def task_type_over_depth(a: Analysis, metric: str = "alpha") -> Finding:
    attr = "alpha" if metric == "alpha" else "greedy"
    diff = getattr(a.effects.row(DOMAIN_MINUS_DEPTH), attr)
    dom, dep = (getattr(a.effects.row(f"{f} (noise-corrected)"), attr) for f in ("domain", "depth"))
    raw_dom, raw_dep = (getattr(a.effects.row(f), attr) for f in ("domain", "depth"))
    key = "task_type_over_depth" + ("" if metric == "alpha" else "_greedy")
    claim = paper_data()["claims"]["task_type_over_depth"]
    if metric != "alpha":
        claim += " (recomputed with greedy_accept)"
    measure = f"noise-corrected η²(domain) − η²(depth) of {metric}"
    paper = "no effect size given"
    detail = (
        f"noise-corrected η²: domain {dom.format(4)}, depth {dep.format(4)} (raw η²: domain "
        f"{raw_dom.format(4, interval=False)}, depth {raw_dep.format(4, interval=False)})"
    )
    figures = (("η² domain", dom), ("η² depth", dep), ("domain − depth", diff))
    if why := _stratified_by(a, "depth"):
        return _untestable(key, claim, paper, measure, diff, why)
    if len(_domains(a)) < 2 or a.info.max_depth < 2:
        return _untestable(
            key, claim, paper, measure, diff, "needs at least two domains and two depths"
        )
    if why := sample_shortfall(a):
        return _untestable(key, claim, paper, measure, diff, why, detail, figures)
    t = _test(a)
    return Finding(
        key, claim, paper, measure, diff, _decide(t.above(diff), t.below(diff)), detail, figures
    )


def only_chat_above_one(a: Analysis) -> Finding:
    claim = paper_data()["claims"]["only_chat_above_one"]
    paper = ", ".join(
        f"{d} {r['expected_length']:.3f}" for d, r in paper_data()["table2"]["rows"].items()
    )
    rows = {r.domain: r.expected_length for r in a.paper.table2 if r.domain in _domains(a)}
    listing = _listing(list(rows.items()))
    figures = tuple((f"{d} E[L]", e) for d, e in rows.items())
    measure = "the paper's E[L] of chat (alpha)"
    if "chat" not in rows:
        return _untestable(
            "only_chat_above_one",
            claim,
            paper,
            "E[L] of chat",
            nan_estimate(),
            "the run has no chat domain",
            listing,
            figures,
        )
    chat, others = rows["chat"], [e for d, e in rows.items() if d != "chat"]
    if why := sample_shortfall(a):
        return _untestable(
            "only_chat_above_one", claim, paper, measure, chat, why, listing, figures
        )
    t = _test(a)
    k = len(rows)
    holds = t.above(chat, 1) and t.all_below(others, 1)
    fails = t.below(chat, 1, k) or t.any_above(others, 1, k)
    return Finding(
        "only_chat_above_one", claim, paper, measure, chat, _decide(holds, fails), listing, figures
    )


def _rises(a: Analysis, key: str, claim: str, paper: str, subset: str, metric: str) -> Finding:
    rows = [(d, a.depth_profile.row(d, subset, metric)) for d in _domains(a) + (ALL,)]
    deltas = [(d, r.delta) for d, r in rows if r is not None]
    overall = dict(deltas).get(ALL, nan_estimate())
    per_domain = [e for d, e in deltas if d != ALL]
    figures = tuple((f"{d} Δ", e) for d, e in deltas if d != ALL)
    measure = (
        f"within-prompt change of mean {metric}, depth 1 → {a.info.max_depth} "
        f"({subset}, all domains)"
    )
    if why := _stratified_by(a, "depth"):
        return _untestable(key, claim, paper, measure, overall, why)
    if a.info.max_depth < 2:
        return _untestable(
            key, claim, paper, "depth 1 → D change", overall, "the run's trees have a single depth"
        )
    if not any(e.defined for e in per_domain):
        return _untestable(
            key,
            claim,
            paper,
            measure,
            overall,
            f"no prompt has {subset} nodes at depth 1 and depth "
            f"{a.info.max_depth}" + (f" within {a.stratum}" if a.stratum else ""),
        )
    if why := sample_shortfall(a):
        return _untestable(
            key, claim, paper, measure, overall, why, _listing(deltas, signed=True), figures
        )
    t = _test(a)
    return Finding(
        key,
        claim,
        paper,
        measure,
        overall,
        _decide(t.all_above(per_domain), t.any_below(per_domain)),
        _listing(deltas, signed=True),
        figures,
    )


def rises_with_depth(a: Analysis) -> list[Finding]:
    claims = paper_data()["claims"]
    paper = ", ".join(f"{d} {r['delta']:+.3f}" for d, r in paper_data()["table4"]["rows"].items())
    return [
        _rises(a, "rises_with_depth", claims["rises_with_depth"], paper, "all nodes", "alpha"),
        _rises(
            a,
            "rises_with_depth_top1_chain",
            "The rise with depth is not a selection effect: it holds along the top-1 chain "
            "(sibling rank 0 at every depth, the same kind of node at each depth).",
            "not examined",
            "top-1 chain",
            "alpha",
        ),
        _rises(
            a,
            "rises_with_depth_greedy_chain",
            "Greedy acceptance given an accepted parent rises with depth along the top-1 chain "
            "(each prompt compared with itself).",
            "not examined",
            "top-1 chain",
            CONDITIONAL,
        ),
    ]


def correlation_claims(a: Analysis) -> list[Finding]:
    claims = paper_data()["claims"]
    lo_c, hi_c = claims["rho_weak_range"]
    paper = ", ".join(f"{d} {r['spearman']:.3f}" for d, r in paper_data()["table6"]["rows"].items())
    rows = [(r.domain, r.spearman) for r in a.paper.table6 if r.domain in _domains(a)]
    overall = next((r.spearman for r in a.paper.table6 if r.domain == ALL), nan_estimate())
    ests = [e for _, e in rows]
    figures = tuple((f"{d} ρ", e) for d, e in rows)
    measure = "Spearman ρ(target entropy, alpha), all domains"
    weak_claim = (
        f"The correlation is weak: ρ lies in [{lo_c}, {hi_c}] in every domain (the "
        f"abstract's [-0.20, -0.15] excludes the paper's own reasoning ρ of -0.149)."
    )
    if not ests:
        return [
            _untestable(
                "rho_negative",
                claims["rho_negative"],
                paper,
                measure,
                overall,
                "the run has no node records",
            ),
            _untestable(
                "rho_weak_range", weak_claim, paper, measure, overall, "the run has no node records"
            ),
        ]
    if why := sample_shortfall(a):
        return [
            _untestable(
                "rho_negative",
                claims["rho_negative"],
                paper,
                measure,
                overall,
                why,
                _listing(rows),
                figures,
            ),
            _untestable(
                "rho_weak_range", weak_claim, paper, measure, overall, why, _listing(rows), figures
            ),
        ]
    t = _test(a)
    negative = Finding(
        "rho_negative",
        claims["rho_negative"],
        paper,
        measure,
        overall,
        _decide(t.all_below(ests), t.any_above(ests)),
        _listing(rows),
        figures,
    )
    inside = all(t.above(e, lo_c) and t.below(e, hi_c) for e in ests)
    k = 2 * len(ests)
    outside = t.any_below(ests, lo_c, k) or t.any_above(ests, hi_c, k)
    weak = Finding(
        "rho_weak_range",
        weak_claim,
        paper,
        measure,
        overall,
        _decide(inside, outside),
        _listing(rows),
        figures,
    )
    return [negative, weak]


def chat_paradox(a: Analysis) -> Finding:
    claim = paper_data()["claims"]["chat_paradox"]
    paper = "chat: entropy 1.252 (highest), alpha 0.565 (highest)"
    p = a.paradox
    measure = "chat's mean alpha minus the best other domain's"
    if p is None or p.domain != "chat":
        why = "fewer than two domains with nodes" if p is None else "the run has no chat domain"
        return _untestable(
            "chat_paradox", claim, paper, "chat's lead in mean alpha", nan_estimate(), why
        )
    detail = (
        f"highest entropy: {p.entropy_top}, highest alpha: {p.alpha_top}, highest greedy "
        f"acceptance: {p.greedy_top}; chat minus each other domain: "
        + "; ".join(
            f"{q.other}: entropy {q.entropy.format(3, signed=True)}, alpha "
            f"{q.alpha.format(3, signed=True)}"
            for q in p.pairwise
        )
    )
    figures = tuple((f"entropy chat − {q.other}", q.entropy) for q in p.pairwise) + tuple(
        (f"alpha chat − {q.other}", q.alpha) for q in p.pairwise
    )
    if why := sample_shortfall(a):
        return _untestable(
            "chat_paradox", claim, paper, measure, p.alpha_lead, why, detail, figures
        )
    t = _test(a)
    leads = [q.entropy for q in p.pairwise] + [q.alpha for q in p.pairwise]
    return Finding(
        "chat_paradox",
        claim,
        paper,
        measure,
        p.alpha_lead,
        _decide(t.all_above(leads), t.any_below(leads)),
        detail,
        figures,
    )


def below_one_no_speedup(a: Analysis) -> Finding:
    claim = paper_data()["claims"]["below_one_no_speedup"]
    paper = "math 0.914 'Negative', code 0.975 and reasoning 0.956 'Marginal'"
    tau = {r.domain: r for r in a.tau}
    measure = "realized tokens per target pass (tau) where E[L] < 1"
    note = (
        "tau counts tokens per target pass (bonus token included); a wall-clock speed-up "
        "also depends on the draft's cost (specscope bench measures it)"
    )
    rows = [r for r in a.paper.table2 if r.domain in _domains(a) and r.domain in tau]
    lengths = tuple((f"{r.domain} E[L]", r.expected_length) for r in rows)
    if a.stratum:
        return _untestable(
            "below_one_no_speedup",
            claim,
            paper,
            measure,
            nan_estimate(),
            f"tau is a per-step figure: it has no value within {a.stratum}",
        )
    if all(e.value >= 1 for _, e in lengths if e.defined):
        none = "no domain has E[L] < 1"
        return _untestable(
            "below_one_no_speedup", claim, paper, none, nan_estimate(), none, note, lengths
        )
    if why := sample_shortfall(a):
        return _untestable(
            "below_one_no_speedup", claim, paper, measure, nan_estimate(), why, note, lengths
        )
    t = _test(a)
    below = [
        (r.domain, r.expected_length)
        for r in rows
        if t.below(r.expected_length, 1) and tau[r.domain].tau.defined
    ]
    if not below:
        none = "no domain's E[L] is significantly below 1"
        return _untestable(
            "below_one_no_speedup", claim, paper, none, nan_estimate(), none, note, lengths
        )
    taus = [tau[d].tau for d, _ in below]
    worst_domain, _ = min(below, key=lambda x: x[1].value)
    holds = all(e.value == 1 and e.se == 0 for e in taus)
    detail = (
        "; ".join(
            f"{d}: E[L] {e.format(3, interval=False)} yet tau {tau[d].tau.format(3)} "
            f"(min {tau[d].min_tau})"
            for d, e in below
        )
        + ". "
        + note
    )
    figures = tuple(item for d, e in below for item in ((f"{d} E[L]", e), (f"{d} tau", tau[d].tau)))
    return Finding(
        "below_one_no_speedup",
        claim,
        paper,
        f"realized tau of {worst_domain} (lowest E[L])",
        tau[worst_domain].tau,
        _decide(holds, t.any_above(taus, 1)),
        detail,
        figures,
    )


CHECKS: tuple[Callable[[Analysis], Finding | list[Finding]], ...] = (
    task_type_over_depth,
    lambda a: task_type_over_depth(a, "greedy_accept"),
    only_chat_above_one,
    rises_with_depth,
    correlation_claims,
    chat_paradox,
    below_one_no_speedup,
)


def evaluate_findings(a: Analysis) -> tuple[Finding, ...]:
    """Every claim of the paper's abstract and conclusion, checked against one analysis."""
    out: list[Finding] = []
    for check in CHECKS:
        result = check(a)
        out.extend(result if isinstance(result, list) else [result])
    return tuple(out)


# --- stratified verdicts --------------------------------------------------------------------------

# the rule of the drafter comparison's verdicts (.drafters)
DRAFTER_RULE = (
    "A accepts more than B: holds if tau_A − tau_B (paired by prompt) is significantly above 0, "
    "does not hold if significantly below (one-sided tests at half of 1 − confidence: 2.5% at "
    "95%), inconclusive otherwise; not testable with fewer than the minimum of prompts in a "
    "domain (10 by default; in every domain for All). Each row is one claim: no correction for "
    "the number of rows."
)


STRATIFIED_RULE = (
    "each claim is checked within every level of the factor (e.g. within sibling "
    "rank 0, 1, 2) with the rules above; holds if it holds within every level "
    "that is testable (an intersection-union test), does not hold if it does not "
    "hold within some level at the level Bonferroni-corrected over the levels, "
    "inconclusive otherwise, not testable if no level is."
)


@dataclass(frozen=True)
class LevelVerdict:
    """One claim's verdict within one level of the stratification factor."""

    stratum: str  # e.g. "sibling_rank 0"
    verdict: Verdict
    figures: tuple[tuple[str, Estimate], ...]
    detail: str


@dataclass(frozen=True)
class StratifiedFinding:
    """Whether a claim still holds once the run is split by a node-level factor."""

    key: str
    factor: str
    verdict: Verdict
    levels: tuple[LevelVerdict, ...]

    def summary(self) -> str:
        """ "does not hold (0: holds; 1: does not hold; 2: not testable)" """
        parts = "; ".join(
            f"{lv.stratum.rsplit(' ', 1)[-1]}: {lv.verdict.value}" for lv in self.levels
        )
        return f"{self.verdict.value} ({parts})" if self.levels else self.verdict.value


def level_verdict(nominal: Finding, strict: Finding) -> Verdict:
    """A level's verdict: "does not hold" only at the corrected level, the rest at the nominal."""
    if strict.verdict == Verdict.FAILS:
        return Verdict.FAILS
    if nominal.verdict in (Verdict.HOLDS, Verdict.UNTESTABLE):
        return nominal.verdict
    return Verdict.INCONCLUSIVE


def combine_levels(verdicts: Sequence[Verdict]) -> Verdict:
    """The stratified verdict from the levels' verdicts (:data:`STRATIFIED_RULE`)."""
    testable = [v for v in verdicts if v != Verdict.UNTESTABLE]
    if not testable:
        return Verdict.UNTESTABLE
    if Verdict.FAILS in testable:
        return Verdict.FAILS
    return Verdict.HOLDS if all(v == Verdict.HOLDS for v in testable) else Verdict.INCONCLUSIVE


def stratified_findings(
    factor: str, strata: Sequence[tuple[str, Sequence[Finding], Sequence[Finding]]]
) -> tuple[StratifiedFinding, ...]:
    """Each claim's verdict across the levels; ``strata`` holds (label, nominal findings, findings
    at the Bonferroni-corrected level) per level."""
    if not strata:
        return ()
    out = []
    for i, first in enumerate(strata[0][1]):
        levels = []
        for label, nominal, strict in strata:
            f, g = nominal[i], strict[i]
            levels.append(LevelVerdict(label, level_verdict(f, g), f.figures, f.detail))
        out.append(
            StratifiedFinding(
                first.key, factor, combine_levels([lv.verdict for lv in levels]), tuple(levels)
            )
        )
    return tuple(out)
