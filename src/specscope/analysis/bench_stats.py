"""The statistics of timed bench runs (``specscope bench``, the llama-server study, the engines'
choice): per method and domain, tokens per second and the decode speed-up over plain with an
interval over prompts and repeats (:func:`summarize_bench`, :func:`paired_speedup`), whether that
interval is narrow enough (:func:`speedup_precision`), and the regret of a chosen candidate against
the best one measured (:func:`regrets`, :func:`least_ratio`).

A bench's prompts and repeats are crossed: what a repeat brings (its freshly started servers, the
machine's state) is common to all its prompts, so each is resampled whole and the two variances add
(:func:`~specscope.analysis.stats.with_repeats`). The best of several noisy speed-ups is
optimistic, so a regret's interval is that of the least of the true ratios, not of the best
measured one. Their error rates on benches of known truth: ``lab.calibration`` (a checkout's lab/).

Numbers only: running a bench, its prompts, predictions and tables are :mod:`specscope.tune.bench`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SpecscopeError
from ..records import ALL_DOMAINS
from .stats import ClusterBootstrap, Estimate, ratio, with_repeats


class BenchError(SpecscopeError, ValueError):
    """A bench that could not confirm what it is asked to: tuning prompts among those timed,
    a policy whose tuning runs cannot be traced; the message says what and what to do."""


@dataclass(frozen=True)
class BenchRun:
    """One method on one prompt: the output, and its times, each repeat's and their median
    (robust to a repeat that a machine's hiccup slowed). Every table and verdict of a bench reads
    one estimate of a prompt's decoding time: the median over its repeats (:attr:`decode_s`)."""

    method: str
    prompt_id: str
    domain: str
    routed_to: str  # the router's domain (routed method), else ""
    tokens: tuple[int, ...]
    steps: int  # verification steps (forward passes of the target for plain)
    time_s: float
    first_token_s: float  # to the first step's tokens: the prefill (assisted: and its chain)
    repeat_times_s: tuple[float, ...] = ()  # every repeat's time, in repeat order
    repeat_first_token_s: tuple[float, ...] = ()  # every repeat's first-token time
    in_sample: bool = False  # a tuning run of the policy measured this prompt
    # tokens the first step emitted: 1 where the prefill gives the first token; transformers'
    # assisted generation verifies a chain drafted from the prompt in its first pass, and all
    # of its accepted tokens arrive at ``first_token_s``
    first_tokens: int = 1

    @property
    def decode_tokens(self) -> int:
        """Tokens after the first step: what :attr:`decode_s` decoded."""
        return max(len(self.tokens) - self.first_tokens, 0)

    @functools.cached_property
    def decode_s(self) -> float:
        """Seconds after the first step, the median over the repeats of each repeat's."""
        if not self.repeat_times_s:
            return self.time_s - self.first_token_s
        times = [t - f for t, f in zip(self.repeat_times_s, self.repeat_first_token_s, strict=True)]
        return statistics.median(times)

    @classmethod
    def from_dict(cls, data: Mapping) -> BenchRun:
        """A run as a bench file holds it (``dataclasses.asdict``), read back."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
        )


@dataclass(frozen=True)
class BenchRow:
    method: str
    domain: str  # or ALL_DOMAINS
    prompts: int
    tokens: int
    time_s: float
    tokens_per_s: float  # end to end, the prefill included
    decode_tokens_per_s: float  # after the first step (the prefill's): the part speculation changes
    speedup: float  # decode tokens per second over plain's, same prompts
    e2e_speedup: float  # end-to-end tokens per second over plain's
    tau: float  # tokens per verification step (nan where not observed)
    exact: bool  # every output equals plain greedy's
    speedup_lo: float = float("nan")  # 95% interval of ``speedup``: prompts resampled within
    speedup_hi: float = float("nan")  # domains and whole repeats, method and plain paired


def summarize_bench(runs: Sequence[BenchRun], n_boot: int = 2000, seed: int = 0) -> list[BenchRow]:
    """Per method and domain (and ``all``): tokens per second end to end and after the first
    token, speed-ups over plain, tau, exactness. Totals over prompts: tokens / seconds. The decode
    speed-up's interval resamples prompts within domains (a prompt's method and plain times stay
    paired), as every interval in specscope does (:mod:`specscope.analysis.stats`), and, where
    the runs keep 2 or more repeats, whole repeats too
    (:func:`~specscope.analysis.stats.with_repeats`: a repeat's state is common to its prompts)."""
    reference = {r.prompt_id: r.tokens for r in runs if r.method == "plain"}
    domains = list(dict.fromkeys(r.domain for r in runs))
    prompts = list(dict.fromkeys(r.prompt_id for r in runs))
    column = {p: i for i, p in enumerate(prompts)}
    domain_of = {r.prompt_id: r.domain for r in runs}
    boot = ClusterBootstrap.draw(np.array([domain_of[p] for p in prompts]), n_boot, seed)

    def rates(part: list[BenchRun]) -> tuple[float, float]:
        secs = sum(r.time_s for r in part)
        decode_secs = sum(r.decode_s for r in part if r.decode_tokens)
        tokens = sum(len(r.tokens) for r in part)
        later = sum(r.decode_tokens for r in part)
        return (
            tokens / secs if secs else float("nan"),
            later / decode_secs if decode_secs > 0 else float("nan"),
        )

    def decode_sums(part: list[BenchRun]) -> np.ndarray:
        """(P, 2): per prompt, tokens after the first step and their seconds."""
        sums = np.zeros((len(prompts), 2))
        for r in part:
            if r.decode_tokens:
                sums[column[r.prompt_id]] += (r.decode_tokens, r.decode_s)
        return sums

    def speedup_interval(mine: list[BenchRun], plain: list[BenchRun]) -> tuple[float, float]:
        timed = {r.prompt_id for r in mine}
        keep = np.array([p in timed for p in prompts])
        sub = boot.subset(np.flatnonzero(keep))
        m, p = sub.total(decode_sums(mine)[keep]), sub.total(decode_sums(plain)[keep])
        reps = ratio(ratio(m[:, 0], m[:, 1]), ratio(p[:, 0], p[:, 1]))
        strata = len({domain_of[q] for q in np.array(prompts)[keep]})
        e = sub.estimate(reps, prompts=int(keep.sum()), strata=strata)
        base = {r.prompt_id: r for r in plain if r.decode_tokens}
        pairs = [(r, base[r.prompt_id]) for r in mine if r.decode_tokens and r.prompt_id in base]
        e = with_repeats(e, *_repeat_speedups(pairs, n_boot, seed + 1))
        return e.lo, e.hi

    rows = []
    for domain in domains + [ALL_DOMAINS]:
        part = [r for r in runs if domain in (ALL_DOMAINS, r.domain)]
        plain = [r for r in part if r.method == "plain"]
        plain_tps, plain_decode = rates(plain)
        for method in dict.fromkeys(r.method for r in part):
            mine = [r for r in part if r.method == method]
            tps, decode = rates(mine)
            tokens = sum(len(r.tokens) for r in mine)
            steps = sum(r.steps for r in mine)
            rows.append(
                BenchRow(
                    method,
                    domain,
                    len(mine),
                    tokens,
                    sum(r.time_s for r in mine),
                    tps,
                    decode,
                    decode / plain_decode,
                    tps / plain_tps,
                    tokens / steps if steps else float("nan"),
                    all(r.tokens == reference[r.prompt_id] for r in mine),
                    *speedup_interval(mine, plain),
                )
            )
    return rows


# --- the chosen against the best measured -------------------------------------------------------


REGRET_BOUND = 0.03  # the share of the best candidate's speed-up a choice may give up
ONE_REPEAT = (
    "not testable: one repeat leaves the variation between repeats unmeasured; time 2 or more"
)


def untestable(interval: float, repeats: int) -> str | None:
    """Why a verdict over several candidates' intervals cannot be given (``interval``: a bound,
    NaN without one), or None: no interval, or one repeat, whose variation is then unmeasured."""
    if not math.isfinite(interval):
        return "not testable: too few prompts for an interval"
    return ONE_REPEAT if repeats < 2 else None


@dataclass(frozen=True)
class Regret:
    """One domain: the speed-up of the candidate tuning chose against the best one measured,
    and an interval of the true regret (:func:`regret_interval`) that says whether it is
    ``bound`` or less."""

    domain: str
    chosen: str
    chosen_speedup: float
    best: str
    best_speedup: float
    # scored on only this many of the domain's prompts (0: all of them): where only ``routed``
    # timed the chosen setting, the prompts the router sent to the domain's own entry
    prompts: int = 0
    lo: float = math.nan  # 95% interval of the true regret (:func:`regret_interval`)
    hi: float = math.nan
    bound: float = REGRET_BOUND
    repeats: int = 1  # repeats behind the interval (one leaves their variation out of it)
    # the candidate that sets the interval's upper end: the one whose speed could lie furthest
    # above the chosen one's ("": none)
    bounded_by: str = ""

    @property
    def regret(self) -> float:
        """1 - chosen / best: the share of the best measured speed-up the choice gives up (the
        best of several noisy speed-ups is optimistic: the interval is not)."""
        return 1 - self.chosen_speedup / self.best_speedup

    @property
    def verdict(self) -> str:
        if reason := untestable(self.hi, self.repeats):
            return reason
        if self.hi <= self.bound:
            return f"holds: {self.bound:.0%} or less"
        if self.lo > self.bound:
            return f"does not hold: above {self.bound:.0%}"
        widest = f" (its upper end set by {self.bounded_by})" if self.bounded_by else ""
        return (
            f"not testable: the interval holds {self.bound:.0%}{widest}; time more prompts or "
            "repeats"
        )

    def to_dict(self) -> dict:
        """As a bench's JSON record holds it: the fields, the regret and the verdict."""
        return {**dataclasses.asdict(self), "regret": self.regret, "verdict": self.verdict}


# methods that are no candidate of their own (a route over the candidates, or one of them)
DERIVED_METHODS = ("routed", "uniform")


@dataclass(frozen=True)
class LeastRatio:
    """An interval of the least of several true ratios (:func:`least_ratio`)."""

    lo: float
    hi: float
    lo_by: str  # the ratio whose lower end is ``lo``
    hi_by: str  # the ratio whose upper end (held together with the others') is ``hi``


def least_ratio(ratios: Mapping[str, Estimate], confidence: float = 0.95) -> LeastRatio:
    """A ``confidence`` interval of the least of the true ``ratios`` (name -> its estimate), as
    a regret or the route test needs when the best rival is picked on the same prompts. The
    lower end is the least of their lower ends, each alone: the least true ratio is one fixed
    ratio's, and that one's lower end alone misses it at most (1 - confidence) / 2 of the time.
    The upper end is the least of their upper ends held together (Bonferroni, at 1 -
    (1 - confidence) / len(ratios)): it misses only where some ratio's upper end does."""
    level = 1 - (1 - confidence) / len(ratios)
    lows = {m: e.interval(confidence)[0] for m, e in ratios.items()}
    highs = {m: e.interval(level)[1] for m, e in ratios.items()}
    lo_by, hi_by = min(lows, key=lows.__getitem__), min(highs, key=highs.__getitem__)
    return LeastRatio(lows[lo_by], highs[hi_by], lo_by, hi_by)


@dataclass(frozen=True)
class RegretInterval:
    """:func:`regret_interval`'s answer."""

    lo: float
    hi: float
    repeats: int  # the fewest repeats behind the candidates' intervals
    bounded_by: str = ""  # the candidate whose interval sets ``hi`` ("": none)


def regret_interval(
    runs: Sequence[BenchRun],
    domain: str,
    chosen: str,
    others: Sequence[str],
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> RegretInterval:
    """A ``confidence`` interval of the true regret of ``chosen`` in ``domain`` (1 - its decode
    speed over that of the fastest of ``others``, in expectation over prompts and repeats).

    The best measured candidate is the best of several noisy speed-ups, so its lead is
    optimistic (the winner's curse: with 8 candidates of equal speed and a 2% standard error
    each, the best measured leads the chosen one by 2.8% on average, 1.42 standard errors).
    Instead the true regret is max(0, 1 - the least of the true ratios chosen / candidate),
    each ratio measured on the same prompts (:func:`paired_speedup`), and its interval is that
    of the least ratio (:func:`least_ratio`: the upper end from each ratio's lower end alone,
    set by the candidate whose it is; the lower end from their upper ends held together); and
    the fewest repeats behind them. With one repeat, what a repeat brings to all of a
    candidate's prompts is left out, and at the bound the regret is called above it in 11% of
    benches rather than 5%:
    :attr:`Regret.verdict` then says not testable (calibrated on benches of known regret,
    ``lab.calibration.regret_verdict_rates``)."""
    if not others:
        return RegretInterval(0.0, 0.0, 0)
    mine = {r.prompt_id: r for r in runs if r.method == chosen and r.domain == domain}
    ratios, repeats = {}, []
    for other in others:
        pairs = [
            (mine[r.prompt_id], r)
            for r in runs
            if r.method == other and r.domain == domain and r.prompt_id in mine
            if r.decode_tokens and mine[r.prompt_id].decode_tokens
        ]
        if not pairs:
            return RegretInterval(math.nan, math.nan, 0)
        paired = paired_speedup(pairs, n_boot, seed)
        ratios[other] = paired.both
        repeats.append(paired.repeats)
    least = least_ratio(ratios, confidence)
    # a regret lies in [0, 1]: no speed is below 0 (few repeats can give a ratio's bound below)
    hi = min(max(0.0, 1 - least.lo), 1.0)
    return RegretInterval(max(0.0, 1 - least.hi), hi, min(repeats), least.lo_by if hi > 0 else "")


def regrets(
    rows: Sequence[BenchRow],
    runs: Sequence[BenchRun],
    chosen: Mapping[str, str],
    derived: Sequence[str] = DERIVED_METHODS,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[Regret, ...]:
    """Per domain of ``chosen`` (domain -> the candidate chosen), its measured decode speed-up
    against the best of the candidates measured (plain included; ``derived`` methods are not
    candidates), with :func:`regret_interval` over the same candidates."""
    out = []
    for domain, pick in chosen.items():
        mine = {r.method: r.speedup for r in rows if r.domain == domain}
        mine = {m: v for m, v in mine.items() if m not in derived}
        if pick not in mine:
            continue
        best = max(mine, key=mine.__getitem__)
        others = [m for m in mine if m != pick]
        i = regret_interval(runs, domain, pick, others, n_boot, seed)
        out.append(
            Regret(domain, pick, mine[pick], best, mine[best], 0, i.lo, i.hi,
                   repeats=i.repeats, bounded_by=i.bounded_by)
        )  # fmt: skip
    return tuple(out)


# --- is the interval narrow enough ---------------------------------------------------------------

TARGET_HALF_WIDTH = 0.05  # ±5% of the speed-up


@dataclass(frozen=True)
class SpeedupPrecision:
    """One domain's decode speed-up of one method, with an interval over prompts and repeats,
    and what it would take to make it ±``target`` or narrower."""

    method: str
    domain: str
    prompts: int
    repeats: int
    speedup: float  # from the median time over repeats of each prompt
    lo: float
    hi: float
    target: float  # relative half-width asked for
    prompts_needed: int | None  # at these repeats (None: prompts alone cannot get there)
    repeats_needed: int | None  # at these prompts (None: repeats alone cannot get there)
    repeat_share: float = math.nan  # share of the variance between repeats (nan: one repeat)

    @property
    def half_width(self) -> float:
        """Half the interval's width over the speed-up (nan without an interval)."""
        return (self.hi - self.lo) / 2 / self.speedup if self.speedup > 0 else math.nan

    @property
    def narrow_enough(self) -> bool:
        """±``target`` or narrower, with the variation between repeats measured (2 or more)."""
        return (
            self.repeats > 1 and math.isfinite(self.half_width) and self.half_width <= self.target
        )


def speedup_precision(
    runs: Sequence[BenchRun],
    target: float = TARGET_HALF_WIDTH,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[SpeedupPrecision, ...]:
    """Per method (plain aside) and domain: the decode speed-up (tokens after the first over
    their seconds, against plain's on the same prompts, repeats paired by round) with a 95%
    interval over prompts and repeats (:func:`_precision`), and the prompts or repeats a
    ±``target`` interval needs (see the module's docstring)."""
    if not 0 < target < 1:
        raise BenchError(f"the target half-width is a fraction in (0, 1), got {target}")
    plain = {r.prompt_id: r for r in runs if r.method == "plain"}
    out = []
    for method in dict.fromkeys(r.method for r in runs if r.method != "plain"):
        for domain in dict.fromkeys(r.domain for r in runs):
            mine = [
                r for r in runs if r.method == method and r.domain == domain and r.decode_tokens
            ]
            pairs = [(r, plain[r.prompt_id]) for r in mine if r.prompt_id in plain]
            if pairs:
                out.append(_precision(method, domain, pairs, target, n_boot, seed))
    return tuple(out)


def _decode_times(run: BenchRun) -> np.ndarray:
    """(R,) seconds after the first token, per repeat (the recorded time's when repeats are not
    kept)."""
    if run.repeat_times_s:
        return np.subtract(run.repeat_times_s, run.repeat_first_token_s)
    return np.array([run.time_s - run.first_token_s])


def _median_last(x: np.ndarray) -> np.ndarray:
    """The median over the last axis; of 3, sum less the extremes (8x np.median's speed)."""
    if x.shape[-1] == 3:
        return x.sum(-1) - x.max(-1) - x.min(-1)
    return np.median(x, axis=-1)


def _repeat_speedups(
    pairs: Sequence[tuple[BenchRun, BenchRun]], n_boot: int, seed: int
) -> tuple[np.ndarray, int]:
    """The decode speed-up of each (method, plain) pair's method over plain, all prompts kept
    and whole repeats drawn with replacement (one draw for every prompt: what a repeat brings is
    common to its prompts), each prompt's time the median of its drawn repeats: ``(B + 1,)``
    replicates, row 0 the sample, and the repeats (1 where the runs do not all keep the same
    number of repeats: nothing to resample)."""
    times = [(_decode_times(m), _decode_times(p)) for m, p in pairs]
    R = len(times[0][0]) if times else 1
    if R < 2 or any(len(a) != R or len(b) != R for a, b in times):
        return np.full(n_boot + 1, np.nan), 1
    picks = np.empty((n_boot + 1, R), dtype=int)
    picks[0] = np.arange(R)
    picks[1:] = np.random.default_rng(seed).integers(0, R, size=(n_boot, R))
    mine = _median_last(np.stack([a for a, _ in times])[:, picks])  # (P, B + 1)
    base = _median_last(np.stack([b for _, b in times])[:, picks])
    tokens = np.array([[m.decode_tokens, p.decode_tokens] for m, p in pairs], float).sum(0)
    return ratio(tokens[0], mine.sum(0)) / ratio(tokens[1], base.sum(0)), R


@dataclass(frozen=True)
class PairedSpeedup:
    """The decode speed-up of one method over another on the same prompts, with its 95%
    interval over prompts alone and over prompts and repeats."""

    by_prompt: Estimate  # prompts resampled (within domains), the repeats kept
    both: Estimate  # and whole repeats resampled too, the two variances added
    repeats: int


def paired_speedup(
    pairs: Sequence[tuple[BenchRun, BenchRun]], n_boot: int = 2000, seed: int = 0
) -> PairedSpeedup:
    """Decode tokens per second of each pair's first run over its second's (the same prompt),
    from the median time over repeats of each: prompts resampled within domains with the repeats
    kept, repeats resampled whole with the prompts kept, the two variances added
    (:func:`~specscope.analysis.stats.with_repeats`)."""
    tokens = np.array([[m.decode_tokens, p.decode_tokens] for m, p in pairs], float)  # (P, 2)
    mine = np.array([m.decode_s for m, _ in pairs])  # (P,) median over repeats
    base = np.array([p.decode_s for _, p in pairs])
    domains = np.array([m.domain for m, _ in pairs])
    boot = ClusterBootstrap.draw(domains, n_boot, seed)
    n = boot.total(tokens)
    by_prompt = boot.estimate(
        ratio(n[:, 0], boot.total(mine)) / ratio(n[:, 1], boot.total(base)),
        prompts=len(pairs),
        strata=len(set(domains)),
    )
    by_repeat, R = _repeat_speedups(pairs, n_boot, seed + 1)
    return PairedSpeedup(by_prompt, with_repeats(by_prompt, by_repeat, R), R)


def _precision(method, domain, pairs, target, n_boot, seed) -> SpeedupPrecision:
    """:func:`paired_speedup`'s interval, and the prompts or repeats that would bring its
    variance down to the target's, from the share of each."""
    P = len(pairs)
    paired = paired_speedup(pairs, n_boot, seed)
    by_prompt, e, R = paired.by_prompt, paired.both, paired.repeats
    prompts_needed = repeats_needed = None
    share = math.nan
    if e.has_interval and e.value > 0:
        share = 1 - by_prompt.se**2 / e.se**2 if R > 1 and e.se > 0 else 0.0
        factor = ((e.hi - e.lo) / 2 / e.value / target) ** 2
        if factor <= 1:
            prompts_needed, repeats_needed = P, R
        else:
            if factor * share < 1:  # the repeats' part must fit: more prompts shrink the rest
                prompts_needed = math.ceil(P * factor * (1 - share) / (1 - factor * share))
            if share > 0 and factor * (1 - share) < 1:
                repeats_needed = math.ceil(R * factor * share / (1 - factor * (1 - share)))
    return SpeedupPrecision(
        method, domain, P, R, e.value, e.lo, e.hi, target, prompts_needed, repeats_needed,
        share if R > 1 else math.nan,  # one repeat: unmeasured
    )  # fmt: skip


# --- routed: its regret where only it timed a choice, and against the best single ----------


def routed_regrets(
    runs: Sequence[BenchRun], domains: Sequence[str]
) -> tuple[tuple[Regret, ...], list[str]]:
    """The regret of each of ``domains``, whose chosen setting no method but ``routed`` timed, on
    the prompts the router sent to the domain's own entry (there ``routed`` decodes the chosen
    setting), against every method on those same prompts; and the domains left unscored (no
    such prompt, or no ``routed`` runs)."""
    scored, left = [], []
    for domain in domains:
        mine = {
            r.prompt_id
            for r in runs
            if r.method == "routed" and r.domain == domain and r.routed_to == domain
        }
        part = [r for r in runs if r.prompt_id in mine]
        rows = summarize_bench(part) if mine else []
        found = regrets(rows, part, {domain: "routed"}, derived=("uniform",))
        if not found:
            left.append(domain)
            continue
        scored.append(dataclasses.replace(found[0], prompts=len(mine)))
    return tuple(scored), left


@dataclass(frozen=True)
class RoutedAgainstSingle:
    """Routed decoding against the best single candidate over all the traffic, with an interval
    of routed over the truly fastest single (:func:`routed_against_best_single`)."""

    best_single: str
    ratio: float  # routed decode tokens per second over the best single's, same prompts
    lo: float  # 95% interval of routed over the truly fastest single (least_ratio)
    hi: float
    prompts: int
    # a single candidate faster than routed (its interval, held together with the others',
    # wholly above routed's speed), if any
    faster_single: str = ""
    beats_every_single: bool = False  # every single's interval, each alone, below routed's
    repeats: int = 1  # repeats behind the intervals (one leaves their variation out of them)

    @property
    def verdict(self) -> str:
        if reason := untestable(self.lo, self.repeats):
            return reason
        if self.beats_every_single:
            return "routing beats the best single setting"
        if self.faster_single:
            return f"routing is slower than a single setting ({self.faster_single})"
        return "no route beats the best single setting (the interval holds 1)"

    def to_dict(self) -> dict:
        """As a bench's JSON record holds it: the fields and the verdict."""
        return {**dataclasses.asdict(self), "verdict": self.verdict}

    @property
    def sentence(self) -> str:
        return (
            f"Routed against the best single setting ({self.best_single}) over all "
            f"{self.prompts} prompts: {self.ratio:.3f}x [{self.lo:.3f}, {self.hi:.3f}]: "
            f"{self.verdict}."
        )


def routed_against_best_single(
    runs: Sequence[BenchRun],
    n_boot: int = 2000,
    seed: int = 0,
    derived: Sequence[str] = DERIVED_METHODS,
    confidence: float = 0.95,
) -> RoutedAgainstSingle:
    """The candidate (``routed`` and the ``derived`` methods aside) of highest decode speed over
    all prompts, and routed's speed over it, with an interval of routed over the truly fastest
    single: the least of the ratios routed / single (prompts resampled within domains and whole
    repeats, the two paired by prompt, :func:`paired_speedup`; :func:`least_ratio`, since the
    best single is picked on the same prompts). "Routing beats" needs every single below
    routed, each alone; "routing is slower" one single above it, held together."""
    rows = summarize_bench(runs, n_boot, seed)
    singles = [
        r
        for r in rows
        if r.domain == ALL_DOMAINS and r.method != "routed" and r.method not in derived
    ]
    best = max(singles, key=lambda r: r.decode_tokens_per_s).method
    routed = {r.prompt_id: r for r in runs if r.method == "routed" and r.decode_tokens}
    ratios, repeats = {}, []
    for single in singles:
        pairs = [
            (routed[r.prompt_id], r)
            for r in runs
            if r.method == single.method and r.prompt_id in routed and r.decode_tokens
        ]
        paired = paired_speedup(pairs, n_boot, seed)
        ratios[single.method] = paired.both
        repeats.append(paired.repeats)
    least = least_ratio(ratios, confidence)
    return RoutedAgainstSingle(
        best,
        ratios[best].value,
        least.lo,
        least.hi,
        len(routed),
        least.hi_by if least.hi < 1 else "",
        least.lo > 1,
        min(repeats),
    )


def rows_against(
    runs: Sequence[BenchRun], method: str, reference: str, n_boot: int = 2000, seed: int = 0
) -> dict[str, BenchRow]:
    """Per domain (and ``all``): ``method``'s bench row with ``reference`` in plain's place, so
    that its speed-up is over ``reference``'s, paired by prompt, with the bench's interval."""
    pair = [dataclasses.replace(r, method="plain") for r in runs if r.method == reference]
    pair += [r for r in runs if r.method == method]
    return {r.domain: r for r in summarize_bench(pair, n_boot, seed) if r.method == method}
