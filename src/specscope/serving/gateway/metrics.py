"""What the gateway served, per domain, as Prometheus metrics (``/metrics``), and a drift signal.

:class:`GatewayMetrics` is an observer of the gateway's log records (``observe(kind, entry)``, the
same records the request and errors logs receive), so the counts it exposes are the logs' counts.
Each answered request's statistics are read with the engine's ingest parser
(:func:`specscope.serving.ingest.formats.engine_format`), so a request counts here exactly as
``specscope ingest`` would count it.

**Names.** The gateway's own series are ``specscope_gateway_*``, named as Prometheus' naming
rules ask (no colons: those are for recording rules; counters end in ``_total``), each with a
``domain`` label: ``specscope_gateway_requests_total`` (answered with statistics),
``..._request_errors_total``, ``..._unreadable_statistics_total``, ``..._prompt_tokens_total``,
``..._generation_tokens_total``, ``..._verify_steps_total``, ``..._draft_tokens_total``,
``..._accepted_tokens_total``, ``..._request_latency_seconds`` (a histogram), and the gauges
``..._tokens_per_step``, ``..._predicted_tokens_per_step`` and ``..._drift``.

vLLM's names (:data:`VLLM_NAMES`) are exported as well only where the deployment asks for them
(``vllm_compatible_metrics = true``, or ``--vllm-compatible-metrics``), so that vLLM's PromQL and
dashboards work per domain: by default they are not, because in front of a vLLM whose own
``/metrics`` is scraped too (or beside one), every ``sum(vllm:...)`` would count each request
twice, and in front of SGLang or llama.cpp they would claim a vLLM that is not there.

**Drift.** For each domain, the served tokens per verify step ``T = sum(accepted + steps) /
sum(steps)`` (the bonus token included, as the policy's prediction), with a 99% interval
from the ratio estimator's request-clustered variance (requests are the independent units, not
steps). The domain drifts when that interval lies wholly outside the policy's predicted interval
(``expected_tau_low``..``expected_tau_high`` when a hand-written policy gives them, else the
point ``prediction.tokens_per_step`` that tune writes, or ``expected_tau``):
``specscope_gateway_drift`` is -1 (below), +1 (above) or 0; before :data:`MIN_REQUESTS`
speculated requests it is NaN (not testable). 99%, not 95%: on simulated requests whose truth is
the prediction (per-request acceptance rates drawn from a Beta, 5 to 60 steps each), a 95%
interval raised false alarms in 6-9% of domains at 30-50 requests (the ratio estimator's
small-sample skew); the 99% one in 1.5-3%, at most the 5% a user would read it at.
``tests/serving/test_gateway_metrics.py`` measures both rates.

It does not serve HTTP (the gateway mounts :meth:`GatewayMetrics.exposition`) or read logs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

from ...errors import SpecscopeError, require
from ...files import read_json_object
from ...schemas import parse
from ..ingest.formats import engine_format
from ..request_stats import IngestError

MIN_REQUESTS = 30  # speculated requests a domain needs before its drift is tested
Z99 = 2.5758293035489004  # two-sided 99% normal quantile (see the module docstring)
PREFIX = "specscope_gateway_"
# The vLLM name of each of the gateway's counters (and the latency histogram), exported only on
# request. Checked against vLLM's source: vllm:request_success, vllm:prompt_tokens,
# vllm:generation_tokens and vllm:e2e_request_latency_seconds in vllm/v1/metrics/loggers.py
# @005a810bc40faa25b8870fbc8559c3462581eee3 (PrometheusStatLogger); vllm:spec_decode_num_drafts,
# vllm:spec_decode_num_draft_tokens and vllm:spec_decode_num_accepted_tokens in
# vllm/v1/spec_decode/metrics.py @016a8587edb04ae53c913a1da9355a07dc0ca4ae (SpecDecodingProm, whose
# docstring gives the PromQL: acceptance rate = accepted / draft tokens, mean acceptance length =
# 1 + accepted / drafts). vLLM labels them model_name and engine (request_success also
# finished_reason); the gateway's copies carry domain instead.
VLLM_NAMES = {
    "requests": "vllm:request_success",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "verify_steps": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "request_latency_seconds": "vllm:e2e_request_latency_seconds",
}
# vLLM's request latency buckets (vllm/v1/metrics/loggers.py @005a810b, request_latency_buckets)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class MetricsError(SpecscopeError, ValueError):
    """A policy file the drift signal cannot read; the message names the field."""


@dataclass(frozen=True)
class Prediction:
    """A domain's predicted tokens per verify step: a point and its interval (equal to the point
    when the policy gives none)."""

    tau: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not (1.0 <= self.low <= self.tau <= self.high) or not math.isfinite(self.high):
            raise MetricsError(
                f"predicted tokens per step {self.tau} with interval [{self.low}, {self.high}]: "
                "need 1 <= low <= expected_tau <= high, all finite"
            )


@dataclass
class DomainTally:
    """Sums over a domain's speculated requests (x: verify steps, y: tokens those steps gave)."""

    n: int = 0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    yy: float = 0.0
    xy: float = 0.0

    def add(self, steps: int, accepted: int) -> None:
        x, y = float(steps), float(steps + accepted)
        self.n += 1
        self.x, self.y = self.x + x, self.y + y
        self.xx, self.yy, self.xy = self.xx + x * x, self.yy + y * y, self.xy + x * y

    def tokens_per_step(self) -> tuple[float, float, float]:
        """``(T, low, high)``: the ratio estimate and its 99% interval (NaN before 2 requests)."""
        if self.n < 2 or self.x <= 0:
            t = self.y / self.x if self.x > 0 else math.nan
            return t, math.nan, math.nan
        t = self.y / self.x
        # sum of (y_i - t x_i)^2, expanded so that only sums are kept
        residual = max(self.yy - 2 * t * self.xy + t * t * self.xx, 0.0)
        se = math.sqrt(residual * self.n / (self.n - 1)) / self.x
        return t, t - Z99 * se, t + Z99 * se


def drift_state(tally: DomainTally, prediction: Prediction, min_requests: int = MIN_REQUESTS):
    """-1 (served below the predicted interval), +1 (above), 0 (consistent), NaN (not testable:
    fewer than ``min_requests`` speculated requests)."""
    if tally.n < min_requests:
        return math.nan
    _, low, high = tally.tokens_per_step()
    if high < prediction.low:
        return -1.0
    if low > prediction.high:
        return 1.0
    return 0.0


class TunePrediction(BaseModel):
    """What the drift signal reads of ``specscope tune``'s prediction record (its schema is
    ``specscope.tune.predict.PredictionRecord``, not imported: it would import torch)."""

    model_config = ConfigDict(extra="allow")
    tokens_per_step: float


class PredictedEntry(BaseModel):
    """What the drift signal reads of a policy entry: ``specscope tune``'s prediction (decoded
    tokens per step), else a hand-written ``expected_tau``; the rest of the entry (its tree,
    drafter) passes unread."""

    model_config = ConfigDict(extra="allow")
    prediction: TunePrediction | None = None
    expected_tau: float | None = None  # None (and no prediction): no speculation
    expected_tau_low: float | None = None
    expected_tau_high: float | None = None


class PolicyPredictions(BaseModel):
    """The part of a ``specscope tune`` policy file the gateway reads: an entry per domain (a
    table, or a tree literal such as ``"none"``) and the uniform entry."""

    model_config = ConfigDict(extra="allow")  # the tune's own keys (format, source, costs...)
    domains: dict[Annotated[str, StringConstraints(min_length=1)], PredictedEntry | str] = {}
    uniform: PredictedEntry | str | None = None


def load_predictions(path: str | Path) -> dict[str, Prediction | None]:
    """Each domain's predicted tokens per step from a ``specscope tune`` policy file (JSON), and
    ``"*"`` for the uniform entry (domains the policy does not list). An entry without a
    prediction or ``expected_tau`` (no speculation) predicts nothing (None)."""
    data = read_json_object(path, MetricsError, "policy file")
    policy = parse(PolicyPredictions, data, f"policy file {path}", MetricsError)
    entries: dict[str, PredictedEntry | str | None] = dict(policy.domains)
    if isinstance(policy.uniform, PredictedEntry):
        entries["*"] = policy.uniform
    out: dict[str, Prediction | None] = {}
    for domain, entry in entries.items():
        given = isinstance(entry, PredictedEntry) and (entry.prediction or entry.expected_tau)
        if not given:
            out[domain] = None  # listed, so the uniform entry does not stand in for it
            continue
        if entry.prediction is not None:  # tune's point, as its expected_tau was
            tau, low, high = entry.prediction.tokens_per_step, None, None
        else:
            tau, low, high = entry.expected_tau, entry.expected_tau_low, entry.expected_tau_high
        try:
            out[domain] = Prediction(
                tau, tau if low is None else low, tau if high is None else high
            )
        except MetricsError as e:
            where = "uniform" if domain == "*" else f"domains.{domain}"
            raise MetricsError(f"policy file {path}: {where}: {e}") from None
    return out


class _Series:
    """One quantity under its specscope name and, where asked, its vLLM name too: ``labels``
    returns the children of both, incremented or observed together."""

    def __init__(self, metrics: Sequence):
        self.metrics = tuple(metrics)

    def labels(self, *values: str) -> _Children:
        return _Children(tuple(m.labels(*values) for m in self.metrics))


@dataclass(frozen=True)
class _Children:
    children: tuple

    def inc(self, amount: float = 1) -> None:
        for child in self.children:
            child.inc(amount)

    def observe(self, value: float) -> None:
        for child in self.children:
            child.observe(value)


class GatewayMetrics:
    """Per-domain counters of what the gateway served, in their own Prometheus registry:
    ``specscope_gateway_*``, and vLLM's names of the same counts where ``vllm_compatible``."""

    def __init__(
        self,
        engine: str,
        domains: Sequence[str],
        predictions: Mapping[str, Prediction | None] | None = None,
        min_requests: int = MIN_REQUESTS,
        vllm_compatible: bool = False,
    ):
        require("gateway", "specscope gateway", ("prometheus_client",))
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.format = engine_format(engine)
        self.domains = tuple(dict.fromkeys(domains))
        given = dict(predictions or {})
        chosen = {d: given[d] if d in given else given.get("*") for d in self.domains}
        self.predictions = {d: p for d, p in chosen.items() if p is not None}
        self.min_requests = min_requests
        self.vllm_compatible = vllm_compatible
        self.tallies = {d: DomainTally() for d in self.domains}
        self.registry = registry = CollectorRegistry()

        def names(key: str) -> list[str]:
            twin = VLLM_NAMES.get(key) if vllm_compatible else None
            return [PREFIX + key, *([twin] if twin else [])]

        def counter(key: str, doc: str, labels=("domain",)) -> _Series:
            return _Series(Counter(n, doc, list(labels), registry=registry) for n in names(key))

        self.success = counter("requests", "Requests answered with statistics.")
        self.errors = counter(
            "request_errors",
            "Requests answered with an error, or without statistics (the errors log).",
            ("domain", "status"),
        )
        self.unparsed = counter(
            "unreadable_statistics",
            "Answers whose statistics the engine's ingest parser refused.",
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of answered requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.drafts = counter("verify_steps", "Verify steps (drafts verified).")
        self.draft_tokens = counter("draft_tokens", "Draft tokens proposed.")
        self.accepted_tokens = counter("accepted_tokens", "Draft tokens accepted.")
        self.latency = _Series(
            Histogram(
                name,
                "Request latency at the gateway, from the request to the answer's end.",
                ["domain"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
            for name in names("request_latency_seconds")
        )
        served = Gauge(
            PREFIX + "tokens_per_step",
            "Served tokens per verify step (bonus token included), with its 99% interval.",
            ["domain", "bound"],
            registry=registry,
        )
        predicted = Gauge(
            PREFIX + "predicted_tokens_per_step",
            "The policy's predicted tokens per verify step and its interval.",
            ["domain", "bound"],
            registry=registry,
        )
        drift = Gauge(
            PREFIX + "drift",
            "-1: served below the predicted interval, +1: above, 0: consistent, NaN: not testable "
            f"(fewer than {min_requests} speculated requests or no prediction).",
            ["domain"],
            registry=registry,
        )
        for domain in self.domains:
            for i, bound in enumerate(("mid", "low", "high")):
                served.labels(domain, bound).set_function(
                    lambda d=domain, i=i: self.tallies[d].tokens_per_step()[i]
                )
            if domain in self.predictions:
                p = self.predictions[domain]
                for bound, value in (("mid", p.tau), ("low", p.low), ("high", p.high)):
                    predicted.labels(domain, bound).set(value)
            drift.labels(domain).set_function(lambda d=domain: self.drift(d))
            for metric in (
                self.success,
                self.prompt_tokens,
                self.generation_tokens,
                self.drafts,
                self.draft_tokens,
                self.accepted_tokens,
                self.unparsed,
            ):
                metric.labels(domain)  # every domain exported from the start, at 0

    def drift(self, domain: str) -> float:
        if domain not in self.predictions:
            return math.nan
        return drift_state(self.tallies[domain], self.predictions[domain], self.min_requests)

    def observe(self, kind: str, entry: Mapping) -> None:
        """One record the gateway logged: ``kind`` is ``"requests"`` (an answer with the engine's
        statistics) or ``"errors"``."""
        domain = str(entry.get("domain"))
        if domain not in self.tallies:  # the router produces only the deployment's domains
            return
        latency = entry.get("latency_s")
        if isinstance(latency, (int, float)) and math.isfinite(latency):
            self.latency.labels(domain).observe(latency)
        if kind != "requests":
            self.errors.labels(domain, str(entry.get("status", ""))).inc()
            return
        self.success.labels(domain).inc()
        response = entry.get("response")
        try:
            stats = self.format.parse(response, f"request {entry.get('prompt_id')}")
        except (IngestError, TypeError, AttributeError):
            self.unparsed.labels(domain).inc()
            return
        usage = response.get("usage") if isinstance(response, Mapping) else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
        if isinstance(prompt, int) and prompt >= 0:
            self.prompt_tokens.labels(domain).inc(prompt)
        if stats.generated is not None:
            self.generation_tokens.labels(domain).inc(stats.generated)
        self.drafts.labels(domain).inc(stats.steps)
        self.accepted_tokens.labels(domain).inc(stats.accepted)
        if stats.drafted is not None:
            self.draft_tokens.labels(domain).inc(stats.drafted)
        if stats.steps > 0:
            self.tallies[domain].add(stats.steps, stats.accepted)

    def exposition(self) -> tuple[bytes, str]:
        """The registry in Prometheus' text format, and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


__all__ = [
    "MIN_REQUESTS",
    "PREFIX",
    "VLLM_NAMES",
    "DomainTally",
    "GatewayMetrics",
    "MetricsError",
    "Prediction",
    "drift_state",
    "load_predictions",
]
