"""The paper's findings, checked against a run: this run's figure, its interval, and a verdict.

A verdict is decided by the intervals, never by a point estimate alone:

- *holds*: the run's intervals agree with the claim (e.g. an effect's interval excludes zero on
  the claimed side, in every domain where the claim is about every domain);
- *does not hold*: an interval excludes the claim (e.g. a significant effect of the other sign);
- *inconclusive*: neither (intervals too wide, or mixed);
- *not testable*: the run lacks what the claim needs (e.g. no chat domain, a single depth).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from specscope.analysis.paper import paper_data
from specscope.analysis.prepare import ALL
from specscope.analysis.stats import Estimate, nan_estimate
from specscope.analysis.tables import CONDITIONAL, DOMAIN_MINUS_DEPTH, Analysis


class Verdict(str, Enum):
    HOLDS = "holds"
    FAILS = "does not hold"
    INCONCLUSIVE = "inconclusive"
    UNTESTABLE = "not testable"


LABELS = {
    "task_type_over_depth": "task type predicts alpha better than depth (η²)",
    "task_type_over_depth_greedy": "task type predicts greedy acceptance better than depth (η²)",
    "only_chat_above_one": "only chat has E[L] > 1",
    "rises_with_depth": "alpha rises with depth (all nodes)",
    "rises_with_depth_top1_chain": "alpha rises with depth (top-1 chain)",
    "rises_with_depth_greedy_chain": "greedy | parent rises with depth (top-1 chain)",
    "rho_negative": "ρ(entropy, alpha) < 0 in every domain",
    "rho_weak_range": "ρ(entropy, alpha) in the paper's weak range in every domain",
    "chat_paradox": "chat has the highest entropy and the highest alpha",
    "below_one_no_speedup": "E[L] < 1 means no speed-up",
}


@dataclass(frozen=True)
class Finding:
    key: str
    claim: str  # the paper's claim, in words
    paper: str  # the paper's own figure
    measure: str  # what this run's figure is
    estimate: Estimate
    verdict: Verdict
    detail: str

    @property
    def label(self) -> str:
        """A short name of the claim, for narrow tables."""
        return LABELS.get(self.key, self.key)


def _above(e: Estimate, x: float = 0.0) -> bool:
    return e.has_interval and e.lo > x


def _below(e: Estimate, x: float = 0.0) -> bool:
    return e.has_interval and e.hi < x


def _sign_verdict(ests: Sequence[Estimate], positive: bool) -> Verdict:
    """Every estimate significantly of the claimed sign: holds; any of the other: does not."""
    claimed, other = (_above, _below) if positive else (_below, _above)
    if not ests or not all(e.defined for e in ests):
        return Verdict.UNTESTABLE if not ests else Verdict.INCONCLUSIVE
    if any(other(e) for e in ests):
        return Verdict.FAILS
    return Verdict.HOLDS if all(claimed(e) for e in ests) else Verdict.INCONCLUSIVE


def _listing(pairs: Sequence[tuple[str, Estimate]], signed: bool = False) -> str:
    return "; ".join(f"{name} {e.format(3, signed=signed)}" for name, e in pairs)


def _domains(a: Analysis) -> tuple[str, ...]:
    return tuple(r.domain for r in a.paper.table1 if r.domain != ALL and r.nodes > 0)


def task_type_over_depth(a: Analysis, metric: str = "alpha") -> Finding:
    attr = "alpha" if metric == "alpha" else "greedy"
    diff = getattr(a.effects.row(DOMAIN_MINUS_DEPTH), attr)
    dom, dep = (getattr(a.effects.row(f), attr) for f in ("domain", "depth"))
    key = "task_type_over_depth" + ("" if metric == "alpha" else "_greedy")
    claim = paper_data()["claims"]["task_type_over_depth"]
    if metric != "alpha":
        claim += " (recomputed with greedy_accept)"
    if len(_domains(a)) < 2 or a.info.max_depth < 2:
        return Finding(key, claim, "no effect size given", "η²(domain) − η²(depth)", diff,
                       Verdict.UNTESTABLE, "needs at least two domains and two depths")
    return Finding(key, claim, "no effect size given", f"η²(domain) − η²(depth) of {metric}",
                   diff, _sign_verdict([diff], positive=True),
                   f"η²(domain) = {dom.format(4)}, η²(depth) = {dep.format(4)} "
                   f"(share of node-level variance explained)")


def only_chat_above_one(a: Analysis) -> Finding:
    claim = paper_data()["claims"]["only_chat_above_one"]
    paper = ", ".join(f"{d} {r['expected_length']:.3f}"
                      for d, r in paper_data()["table2"]["rows"].items())
    rows = {r.domain: r.expected_length for r in a.paper.table2 if r.domain in _domains(a)}
    listing = _listing(list(rows.items()))
    if "chat" not in rows:
        return Finding("only_chat_above_one", claim, paper, "E[L] of chat", nan_estimate(),
                       Verdict.UNTESTABLE, "the run has no chat domain; " + listing)
    chat, others = rows["chat"], [e for d, e in rows.items() if d != "chat"]
    if _below(chat, 1) or any(_above(e, 1) for e in others):
        verdict = Verdict.FAILS
    elif _above(chat, 1) and all(_below(e, 1) for e in others):
        verdict = Verdict.HOLDS
    else:
        verdict = Verdict.INCONCLUSIVE
    return Finding("only_chat_above_one", claim, paper, "the paper's E[L] of chat (alpha)", chat,
                   verdict, listing)


def _rises(a: Analysis, key: str, claim: str, paper: str, subset: str, metric: str) -> Finding:
    rows = [(d, a.depth_profile.row(d, subset, metric)) for d in _domains(a) + (ALL,)]
    deltas = [(d, r.delta) for d, r in rows if r is not None]
    overall = dict(deltas).get(ALL, nan_estimate())
    per_domain = [e for d, e in deltas if d != ALL]
    if a.info.max_depth < 2:
        return Finding(key, claim, paper, "depth 1 → D delta", overall, Verdict.UNTESTABLE,
                       "the run's trees have a single depth")
    return Finding(key, claim, paper, f"mean {metric}, depth {a.info.max_depth} minus depth 1 "
                   f"({subset}, all domains)", overall,
                   _sign_verdict(per_domain, positive=True), _listing(deltas, signed=True))


def rises_with_depth(a: Analysis) -> list[Finding]:
    claims = paper_data()["claims"]
    paper = ", ".join(f"{d} {r['delta']:+.3f}" for d, r in paper_data()["table4"]["rows"].items())
    return [
        _rises(a, "rises_with_depth", claims["rises_with_depth"], paper, "all nodes", "alpha"),
        _rises(a, "rises_with_depth_top1_chain",
               "The rise with depth is not a selection effect: it holds along the top-1 chain "
               "(sibling rank 0 at every depth, the same kind of node at each depth).",
               "not examined", "top-1 chain", "alpha"),
        _rises(a, "rises_with_depth_greedy_chain",
               "Greedy acceptance given an accepted parent rises with depth along the top-1 chain.",
               "not examined", "top-1 chain", CONDITIONAL),
    ]


def correlation_claims(a: Analysis) -> list[Finding]:
    claims = paper_data()["claims"]
    lo_c, hi_c = claims["rho_weak_range"]
    paper = ", ".join(f"{d} {r['spearman']:.3f}" for d, r in paper_data()["table6"]["rows"].items())
    rows = [(r.domain, r.spearman) for r in a.paper.table6 if r.domain in _domains(a)]
    overall = next((r.spearman for r in a.paper.table6 if r.domain == ALL), nan_estimate())
    ests = [e for _, e in rows]
    negative = Finding("rho_negative", claims["rho_negative"], paper,
                       "Spearman ρ(target entropy, alpha), all domains", overall,
                       _sign_verdict(ests, positive=False), _listing(rows))
    if not ests or not all(e.defined for e in ests):
        verdict = Verdict.UNTESTABLE if not ests else Verdict.INCONCLUSIVE
    elif any(_below(e, lo_c) or _above(e, hi_c) for e in ests):
        verdict = Verdict.FAILS
    elif all(e.has_interval and lo_c <= e.lo and e.hi <= hi_c for e in ests):
        verdict = Verdict.HOLDS
    else:
        verdict = Verdict.INCONCLUSIVE
    weak = Finding("rho_weak_range",
                   f"The correlation is weak: ρ lies in [{lo_c}, {hi_c}] in every domain.",
                   paper, "Spearman ρ(target entropy, alpha), all domains", overall, verdict,
                   _listing(rows) + f" (holds: every interval inside [{lo_c}, {hi_c}]; "
                   f"does not hold: an interval outside it)")
    return [negative, weak]


def chat_paradox(a: Analysis) -> Finding:
    claim = paper_data()["claims"]["chat_paradox"]
    paper = "chat: entropy 1.252 (highest), alpha 0.565 (highest)"
    p = a.paradox
    if p is None or p.domain != "chat":
        why = "fewer than two domains with nodes" if p is None else "the run has no chat domain"
        return Finding("chat_paradox", claim, paper, "chat's lead in mean alpha", nan_estimate(),
                       Verdict.UNTESTABLE, why)
    if _below(p.entropy_lead) or _below(p.alpha_lead):
        verdict = Verdict.FAILS
    elif _above(p.entropy_lead) and _above(p.alpha_lead):
        verdict = Verdict.HOLDS
    else:
        verdict = Verdict.INCONCLUSIVE
    detail = (f"highest entropy: {p.entropy_top}, highest alpha: {p.alpha_top}, highest greedy "
              f"acceptance: {p.greedy_top}; chat's lead in entropy {p.entropy_lead.format(3, signed=True)}, "
              f"in greedy acceptance {p.greedy_lead.format(3, signed=True)}; share of resamples "
              f"with chat top in both entropy and alpha: "
              + ("—" if p.p_both != p.p_both else f"{p.p_both:.2f}"))
    return Finding("chat_paradox", claim, paper,
                   "chat's mean alpha minus the best other domain's", p.alpha_lead, verdict, detail)


def below_one_no_speedup(a: Analysis) -> Finding:
    claim = paper_data()["claims"]["below_one_no_speedup"]
    paper = "math 0.914 'Negative', code 0.975 and reasoning 0.956 'Marginal'"
    tau = {r.domain: r for r in a.tau}
    below = [(r.domain, r.expected_length) for r in a.paper.table2
             if r.domain in _domains(a) and r.expected_length.defined
             and r.expected_length.value < 1]
    below = [(d, e) for d, e in below if d in tau and tau[d].tau.defined]
    if not below:
        e = tau[ALL].tau if ALL in tau else nan_estimate()
        return Finding("below_one_no_speedup", claim, paper, "mean tau", e, Verdict.INCONCLUSIVE,
                       "no domain of this run has E[L] < 1; yet every step emits at least one "
                       "token (tau >= 1), so E[L] is not tokens per target pass")
    worst_domain, _ = min(below, key=lambda x: x[1].value)
    taus = [tau[d].tau for d, _ in below]
    if any(_above(t, 1) for t in taus):
        verdict = Verdict.FAILS
    elif all(t.value <= 1 for t in taus):
        verdict = Verdict.HOLDS
    else:
        verdict = Verdict.INCONCLUSIVE
    detail = "; ".join(f"{d}: E[L] {e.format(3, interval=False)} yet tau {tau[d].tau.format(3)} "
                       f"(min {tau[d].min_tau})" for d, e in below)
    detail += (". tau counts tokens per target pass (bonus token included); the wall-clock "
               "speed-up also depends on the draft's cost")
    return Finding("below_one_no_speedup", claim, paper,
                   f"realized mean tau of {worst_domain} (lowest E[L])", tau[worst_domain].tau,
                   verdict, detail)


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
