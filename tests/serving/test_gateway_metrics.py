"""The gateway's metrics: exact counts from log records, and the drift signal's calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("prometheus_client")

from specscope.serving.gateway.metrics import (
    MIN_REQUESTS,
    DomainTally,
    GatewayMetrics,
    MetricsError,
    Prediction,
    drift_state,
    load_predictions,
)


def llama_record(domain: str, steps: int, accepted: int, drafted: int, predicted: int, **extra):
    timings = {
        "predicted_n": predicted,
        "draft_n": drafted,
        "draft_n_accepted": accepted,
        "draft_n_verif_steps": steps,
    }
    return {
        "prompt_id": f"p-{domain}",
        "domain": domain,
        "response": {"id": "x", "timings": timings, "usage": {"prompt_tokens": 11}},
        **extra,
    }


def sample(text: str, name: str, **labels) -> float | None:
    """The value of one sample in Prometheus' text format."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # written sorted
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_counts_are_the_logged_statistics_per_domain():
    metrics = GatewayMetrics("llama.cpp", ["code", "chat"])
    # 2 code requests: 10 steps, 17 accepted of 40 drafted, 30 generated; 5 steps 3 of 20, 12
    metrics.observe("requests", llama_record("code", 10, 17, 40, 30, latency_s=0.4))
    metrics.observe("requests", llama_record("code", 5, 3, 20, 12, latency_s=1.2))
    metrics.observe("errors", {"domain": "chat", "status": 502, "latency_s": 0.01})
    metrics.observe("requests", {"domain": "chat", "response": {"no": "timings"}})
    text = metrics.exposition()[0].decode()
    assert sample(text, "specscope_gateway_requests_total", domain="code") == 2
    assert sample(text, "specscope_gateway_verify_steps_total", domain="code") == 15
    assert sample(text, "specscope_gateway_accepted_tokens_total", domain="code") == 20
    assert sample(text, "specscope_gateway_draft_tokens_total", domain="code") == 60
    assert sample(text, "specscope_gateway_generation_tokens_total", domain="code") == 42
    assert sample(text, "specscope_gateway_prompt_tokens_total", domain="code") == 22
    assert sample(text, "specscope_gateway_request_latency_seconds_count", domain="code") == 2
    assert sample(
        text, "specscope_gateway_request_latency_seconds_sum", domain="code"
    ) == pytest.approx(1.6)
    assert sample(text, "specscope_gateway_request_errors_total", domain="chat", status=502) == 1
    assert sample(text, "specscope_gateway_unreadable_statistics_total", domain="chat") == 1
    assert sample(text, "specscope_gateway_verify_steps_total", domain="chat") == 0
    # served tokens per step: (15 + 20) / 15
    assert sample(text, "specscope_gateway_tokens_per_step", domain="code", bound="mid") == (
        pytest.approx(35 / 15)
    )
    # no prediction given: drift not testable
    assert math.isnan(sample(text, "specscope_gateway_drift", domain="code"))


def test_the_ratio_interval_is_the_request_clustered_one():
    tally = DomainTally()
    xs, ys = [10, 5, 8, 12], [27, 8, 20, 25]
    for x, y in zip(xs, ys):
        tally.add(x, y - x)
    t, low, high = tally.tokens_per_step()
    assert t == pytest.approx(sum(ys) / sum(xs))
    n = len(xs)
    residual = sum((y - t * x) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(residual * n / (n - 1)) / sum(xs)
    assert (low, high) == pytest.approx((t - 2.575829 * se, t + 2.575829 * se))


def _simulate(rng, n_requests: int, a: float, b: float, k: int) -> DomainTally:
    """Requests of a chain-of-k drafter: each request's acceptance rate from Beta(a, b), its
    steps from 5..60, each step accepting the leading run of Bernoulli(alpha) drafts."""
    tally = DomainTally()
    alphas = rng.beta(a, b, n_requests)
    for alpha in alphas:
        steps = int(rng.integers(5, 61))
        runs = np.cumprod(rng.random((steps, k)) < alpha, axis=1).sum(axis=1)
        tally.add(steps, int(runs.sum()))
    return tally


def _true_tau(a: float, b: float, k: int) -> float:
    """E[1 + sum_j alpha^j] over alpha ~ Beta(a, b): exact, from the Beta moments."""
    moments, m = [], 1.0
    for j in range(k):
        m *= (a + j) / (a + b + j)
        moments.append(m)
    return 1.0 + sum(moments)


@pytest.mark.calibration  # 1,800 simulated domains, about 10 s
@pytest.mark.parametrize("a, b", [(6.0, 3.0), (2.0, 2.0)])
def test_drift_false_alarms_at_most_nominal_and_a_real_shift_is_found(a, b):
    """Requests whose truth is the prediction raise an alarm in at most 5% of domains (the
    nominal rate a user reads the signal at), from the fewest requests it tests on up; a domain
    serving 12% fewer tokens per step than predicted is found."""
    rng = np.random.default_rng(2026)
    k = 4
    truth = _true_tau(a, b, k)
    exact = Prediction(truth, truth, truth)
    trials = 400  # a Monte Carlo standard error of about 1.1% at a 5% rate
    for n in (MIN_REQUESTS, 100):
        alarms = sum(drift_state(_simulate(rng, n, a, b, k), exact) != 0 for _ in range(trials))
        assert alarms / trials <= 0.05, (n, alarms)
    shifted = Prediction(truth * 1.12, truth * 1.12, truth * 1.12)
    found = sum(drift_state(_simulate(rng, 300, a, b, k), shifted) == -1 for _ in range(100))
    assert found >= 80


def test_drift_is_not_tested_before_enough_requests():
    rng = np.random.default_rng(1)
    tally = _simulate(rng, 29, 6.0, 3.0, 4)
    assert math.isnan(drift_state(tally, Prediction(1.0, 1.0, 1.0)))
    tally.add(10, 0)
    assert drift_state(tally, Prediction(1.0, 1.0, 1.0)) == 1


def test_predictions_from_a_policy_file(tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(
        '{"domains": {"code": {"tree": "[(0,)]", "expected_tau": 2.5, "expected_tau_low": 2.2,'
        ' "expected_tau_high": 2.9}, "chat": {"tree": "none"}, "math": {"tree": "[(0,)]",'
        ' "prediction": {"tokens_per_step": 2.1, "interval": [2.0, 2.3], "method": "replay"}}},'
        ' "uniform": {"tree": "[(0,)]", "expected_tau": 1.8}}'
    )
    predictions = load_predictions(policy)
    assert predictions == {
        "code": Prediction(2.5, 2.2, 2.9),  # by hand
        "chat": None,  # listed without speculation: the uniform entry does not stand in
        "math": Prediction(2.1, 2.1, 2.1),  # as specscope tune writes it: the point
        "*": Prediction(1.8, 1.8, 1.8),
    }
    predictions.pop("math")
    metrics = GatewayMetrics("llama.cpp", ["code", "math", "chat"], predictions)
    text = metrics.exposition()[0].decode()
    assert sample(text, "specscope_gateway_predicted_tokens_per_step", domain="code", bound="low")
    assert sample(
        text, "specscope_gateway_predicted_tokens_per_step", domain="math", bound="mid"
    ) == pytest.approx(1.8)
    assert (
        sample(text, "specscope_gateway_predicted_tokens_per_step", domain="chat", bound="mid")
        is None
    )
    # a policy file of the wrong shape is refused in one line naming the key, never read as
    # something else (a list of domains was read character by character: "cx" served as "c")
    for text, message in (
        ('{"domains": ["cx"]}', r"domains must be a table \(an object\), got \['cx'\]$"),
        ('{"domains": "code"}', r"domains must be a table \(an object\), got 'code'$"),
        ('{"domains": {"code": {"expected_tau": "2"}}}', "expected_tau must be a number or none"),
    ):
        policy.write_text(text)
        with pytest.raises(MetricsError, match=message):
            load_predictions(policy)
    policy.write_text('{"domains": {"code": {"expected_tau": 0.5}}}')
    with pytest.raises(MetricsError, match=r"domains.code: .*need 1 <= low"):
        load_predictions(policy)
