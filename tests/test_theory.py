"""Acceptance criteria and KL certificates: exact formulas against brute-force minimisation."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import logsumexp, softmax

from specscope import theory as T
from specscope.analysis import certify as C
from specscope.records import SCHEMAS, RunDir, load_run, to_table

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- strategies ---------------------------------------------------------------------------------


@st.composite
def dists(draw, min_v: int = 3, max_v: int = 5) -> np.ndarray:
    """Random distributions: generic, tied (small integer weights), peaked and nearly flat."""
    v = draw(st.integers(min_v, max_v))
    kind = draw(st.sampled_from(["generic", "tied", "peaked", "flat"]))
    if kind == "tied":
        w = np.array(draw(st.lists(st.integers(1, 4), min_size=v, max_size=v)), float)
    elif kind == "flat":
        w = 1.0 + np.array(draw(st.lists(st.floats(0, 0.05), min_size=v, max_size=v)))
    else:
        w = np.array(draw(st.lists(st.floats(0.01, 1.0), min_size=v, max_size=v)))
        if kind == "peaked":
            w[draw(st.integers(0, v - 1))] = draw(st.floats(5.0, 500.0))
    return w / w.sum()


criteria = st.one_of(
    st.just(T.Greedy()),
    st.floats(0.0, 0.6).map(T.Additive),
    st.floats(0.05, 1.0).map(T.Multiplicative),
    st.integers(1, 4).map(T.TopM),
    st.builds(T.Entropy, eps=st.floats(0.02, 0.6), delta=st.floats(0.05, 2.0)),
)


# --- brute force --------------------------------------------------------------------------------


def _min_kl(p: np.ndarray, pairs: list[tuple[int, int]], seed: int = 0) -> float:
    """min KL(p || softmax(z)) s.t. z[hi] >= z[lo] for (hi, lo) in pairs: a smooth convex problem
    in z with linear constraints, solved by SLSQP from several starts."""
    const = float(np.sum(p[p > 0] * np.log(p[p > 0])))

    def f(z):
        return logsumexp(z) - p @ z + const

    def grad(z):
        return softmax(z) - p

    cons = [
        {
            "type": "ineq",
            "fun": lambda z, h=h, lo=lo: z[h] - z[lo],
            "jac": lambda z, h=h, lo=lo: np.eye(len(p))[h] - np.eye(len(p))[lo],
        }
        for h, lo in pairs
    ]
    rng = np.random.default_rng(seed)
    starts = [np.log(p + 1e-3), np.zeros(len(p)), rng.normal(size=len(p))]
    best = math.inf
    for z0 in starts:
        res = minimize(
            f,
            z0,
            jac=grad,
            constraints=cons,
            method="SLSQP",
            options={"ftol": 1e-15, "maxiter": 500},
        )
        if all(res.x[h] - res.x[lo] >= -1e-7 for h, lo in pairs):
            best = min(best, float(res.fun))
    return best


def brute_level_set(p: np.ndarray, crit: T.Criterion) -> float:
    """Min over every rejected token y of min KL s.t. y is a maximiser of q."""
    v = len(p)
    rejected = [y for y, ok in enumerate(T.accepted_mask(p, crit).tolist()) if not ok]
    return min(
        (_min_kl(p, [(y, z) for z in range(v) if z != y]) for y in rejected), default=math.inf
    )


def brute_tree(p: np.ndarray, m: int) -> float:
    """Min over every set B of m rivals of min KL s.t. q(b) >= q(x0) for b in B."""
    x0 = int(np.argmax(p))
    others = [z for z in range(len(p)) if z != x0]
    return min(
        (_min_kl(p, [(b, x0) for b in rivals]) for rivals in itertools.combinations(others, m)),
        default=math.inf,
    )


# --- exact certificates vs brute force ----------------------------------------------------------


@FAST
@given(p=dists(), crit=criteria)
def test_level_set_certificate_equals_brute_force(p, crit):
    exact = float(T.certificate(p, crit))
    brute = brute_level_set(p, crit)
    if math.isinf(brute):
        assert math.isinf(exact)
    else:
        assert exact == pytest.approx(brute, abs=1e-6)


@FAST
@given(p=dists(), m=st.integers(1, 4))
def test_tree_certificate_equals_brute_force(p, m):
    exact = float(T.certificate(p, T.TreeCoverage(m)))
    brute = brute_tree(p, m)
    if math.isinf(brute):
        assert math.isinf(exact)
    else:
        assert exact == pytest.approx(brute, abs=1e-6)


def test_tree_pools_only_the_weak_rivals():
    """p1 = 0.39 keeps q = p: pooling x0 with both rivals would overpay."""
    p = np.array([0.40, 0.39, 0.11, 0.10])
    c = 0.5 * (p[0] + p[2])
    two = p[0] * math.log(p[0] / c) + p[2] * math.log(p[2] / c)
    pbar = p[:3].mean()
    three = sum(x * math.log(x / pbar) for x in p[:3])
    exact = float(T.certificate(p, T.TreeCoverage(2)))
    assert exact == pytest.approx(two, abs=1e-12) and exact < three
    assert T.worst_case_drafter(p, T.TreeCoverage(2))[1] == pytest.approx(0.39)


@FAST
@given(p=dists(3, 6))
def test_greedy_closed_form_and_ceiling(p):
    p0, p1 = np.sort(p)[::-1][:2]
    closed = p0 * math.log(2 * p0 / (p0 + p1)) + (p1 * math.log(2 * p1 / (p0 + p1)) if p1 else 0)
    c = float(T.certificate(p, T.Greedy()))
    assert c == pytest.approx(closed, abs=1e-12)
    assert c == pytest.approx(float(T.certificate(p, T.TreeCoverage(1))), abs=1e-12)
    assert 0 <= c <= math.log(2)


def test_ceilings_reached_for_near_deterministic_targets():
    for eps in (1e-6, 1e-12, 1e-30, 0.0):
        p = np.full(20, eps)
        p[3] = 1 - 19 * eps
        assert float(T.certificate(p, T.Greedy())) == pytest.approx(math.log(2), abs=1e-2)
        assert float(T.certificate(p, T.Greedy())) <= math.log(2)
        for m in (1, 2, 4, 8):
            c = float(T.certificate(p, T.TreeCoverage(m)))
            assert c <= math.log(m + 1) + 1e-15
            assert c == pytest.approx(math.log(m + 1), abs=5e-2)
    assert np.isfinite(T.certificate(np.eye(5)[2], T.Greedy()))


def test_ties_give_zero_certificates():
    p = np.array([0.3, 0.3, 0.2, 0.2])
    assert float(T.certificate(p, T.Greedy())) == 0.0  # x1 ties x0 and greedy accepts x0 only
    assert float(T.certificate(p, T.TreeCoverage(1))) == 0.0
    assert float(T.certificate([0.3, 0.3, 0.3, 0.1], T.TopM(2))) == 0.0  # x2 is outside the top 2
    assert float(T.certificate(p, T.Additive(0.0))) > 0  # p(x) >= p0 accepts both tied tokens


def test_nothing_rejected_gives_infinite_certificate():
    p = np.array([0.5, 0.3, 0.2])
    assert math.isinf(float(T.certificate(p, T.Additive(1.0))))
    assert math.isinf(float(T.certificate(p, T.TopM(3))))
    assert math.isinf(float(T.certificate(p, T.TreeCoverage(3))))
    assert math.isinf(float(T.certificate([1.0], T.Greedy())))
    assert np.isnan(T.worst_case_drafter(p, T.TopM(3))).all()


def test_batched_and_torch_inputs_match_rows():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(50, 0.3), size=6)
    for spec in (
        T.Greedy(),
        T.Additive(0.1),
        T.Multiplicative(0.5),
        T.TopM(2),
        T.Entropy(),
        T.TreeCoverage(4),
    ):
        batched = T.certificate(torch.tensor(p, dtype=torch.float32), spec)
        assert batched.shape == (6,)
        rows = [float(T.certificate(row, spec)) for row in p]
        np.testing.assert_allclose(batched, rows, rtol=1e-5)


# --- soundness and tightness --------------------------------------------------------------------


@FAST
@given(p=dists(3, 6), crit=criteria, seed=st.integers(0, 2**32 - 1))
def test_soundness_certified_drafters_are_accepted(p, crit, seed):
    rng = np.random.default_rng(seed)
    cert = float(T.certificate(p, crit))
    accepted = T.accepted_mask(p, crit)
    for sigma in (0.05, 0.2, 0.5, 1.0, 2.0):
        q = softmax(np.log(p) + sigma * rng.normal(size=(20, len(p))), axis=1)
        kl = T.kl_divergence(np.repeat(p[None], 20, 0), q)
        for qi in q[kl < cert]:
            assert accepted[qi >= qi.max()].all()  # every maximiser of q is accepted


@FAST
@given(p=dists(3, 6), m=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_tree_soundness(p, m, seed):
    rng = np.random.default_rng(seed)
    cert = float(T.certificate(p, T.TreeCoverage(m)))
    q = softmax(np.log(p) + rng.normal(size=(50, len(p))) * rng.uniform(0.05, 2, (50, 1)), axis=1)
    ps = np.repeat(p[None], 50, 0)
    kl = T.kl_divergence(ps, q)
    assert T.tree_covered(ps, q, m)[kl < cert].all()


@FAST
@given(p=dists(3, 6), spec=st.one_of(criteria, st.integers(1, 4).map(T.TreeCoverage)))
def test_worst_case_drafter_attains_the_certificate(p, spec):
    cert = float(T.certificate(p, spec))
    q = T.worst_case_drafter(p, spec)
    if math.isinf(cert):
        assert np.isnan(q).all()
        return
    assert float(T.kl_divergence(p, q)) == pytest.approx(cert, abs=1e-12)
    q_strict = T.worst_case_drafter(p, spec, slack=1e-6)
    kl = float(T.kl_divergence(p, q_strict))
    assert cert - 1e-12 <= kl <= cert + 1e-5  # just above C, and rejected by plain argmax
    if isinstance(spec, T.TreeCoverage):
        assert not T.tree_covered(p, q_strict, spec.m)
        assert not T.tree_covered(p, q, spec.m)  # ties against coverage
    else:
        assert not T.accepts(p, q_strict, spec)
        assert not T.accepted_mask(p, spec)[q >= q.max() * (1 - 1e-12)].all()  # ties against


# --- margin-only bounds -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(p=dists(3, 8), spec=st.one_of(criteria, st.integers(1, 6).map(T.TreeCoverage)))
def test_margin_bounds_are_below_the_exact_certificates(p, spec):
    s = np.sort(p)[::-1]
    assert float(T.margin_bound(s[0] - s[1], spec)) <= float(T.certificate(p, spec)) + 1e-12


def _phi(x):
    return 0.5 * ((1 + x) * math.log(1 + x) + ((1 - x) * math.log(1 - x) if x < 1 else 0.0))


@pytest.mark.parametrize("delta", [0.0, 0.05, 0.3, 0.7, 0.99])
def test_margin_bounds_are_sharp(delta):
    two = np.array([(1 + delta) / 2, (1 - delta) / 2])
    assert float(T.margin_bound(delta, T.Greedy())) == pytest.approx(_phi(delta), abs=1e-15)
    assert float(T.certificate(two, T.Greedy())) == pytest.approx(_phi(delta), abs=1e-12)
    assert delta**2 / 2 <= _phi(delta) + 1e-15 <= math.log(2) + 1e-15
    for m in (1, 2, 4, 8):  # attained at ((1 + m delta), (1 - delta) x m) / (m + 1)
        star = np.array([1 + m * delta] + [1 - delta] * m) / (m + 1)
        for spec in (T.TopM(m), T.TreeCoverage(m)):
            assert float(T.certificate(star, spec)) == pytest.approx(
                float(T.margin_bound(delta, spec)), abs=1e-12
            )
        assert float(T.margin_bound(delta, T.TreeCoverage(m))) <= math.log(m + 1)
    if delta > 0.1:  # x1 itself rejected: the two-token target attains phi(delta)
        assert float(T.certificate(two, T.Additive(0.1))) == pytest.approx(
            float(T.margin_bound(delta, T.Additive(0.1))), abs=1e-12
        )
    r = (1 - 0.5) / (1 + 0.5)
    if delta > r:
        assert float(T.certificate(two, T.Multiplicative(0.5))) == pytest.approx(
            float(T.margin_bound(delta, T.Multiplicative(0.5))), abs=1e-12
        )


def test_additive_bound_is_approached_inside_the_slack():
    t, delta, eta = 0.2, 0.15, 1e-9  # t/2 <= delta <= t: p = (a, a - delta, a - t - eta)
    a = (1 + delta + t + eta) / 3
    p = np.array([a, a - delta, a - t - eta])
    assert float(T.certificate(p, T.Additive(t))) == pytest.approx(
        float(T.margin_bound(delta, T.Additive(t))), abs=1e-7
    )


def test_multiplicative_bound_is_approached_below_the_boundary():
    a_, delta = 0.5, 0.2  # delta < (1 - a) / (1 + a): p0 = delta / (1 - a), p1 just below a p0
    p0 = delta / (1 - a_)
    rest = 1 - p0 - (p0 - delta)
    p = np.array([p0, p0 - delta - 1e-10] + [rest / 1000] * 1000)
    p /= p.sum()
    assert float(T.certificate(p, T.Multiplicative(a_))) == pytest.approx(
        float(T.margin_bound(delta, T.Multiplicative(a_))), abs=1e-6
    )


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p, word",
    [
        ([0.5, 0.6], "sum to 1"),
        ([1.2, -0.2], "negative"),
        ([math.nan, 1.0], "NaN"),
        (np.zeros((2, 0)), "empty vocabulary"),
        ([math.inf, 0.0], "infinite"),
        (np.ones((2, 2, 2)) / 2, "shape"),
    ],
)
def test_bad_distributions_are_rejected(p, word):
    with pytest.raises(ValueError, match=f"p: .*{word}"):
        T.certificate(p, T.Greedy())


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: T.Additive(-0.1), "t"),
        (lambda: T.Additive(1.5), "t"),
        (lambda: T.Multiplicative(0.0), "a"),
        (lambda: T.Multiplicative(1.01), "a"),
        (lambda: T.TopM(0), "m"),
        (lambda: T.TreeCoverage(0), "m"),
        (lambda: T.TopM(1.5), "m"),
        (lambda: T.Entropy(eps=0.0), "eps"),
        (lambda: T.Entropy(delta=-1.0), "delta"),
        (lambda: T.CriteriaConfig(additive_t=2.0), "t"),
        (lambda: T.CriteriaConfig(tree_m=(0,)), "m"),
        (lambda: T.CriteriaConfig(entropy_eps=None), "entropy_eps"),
    ],
)
def test_bad_parameters_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=f"^{arg}"):
        make()


def test_q_is_validated_and_shapes_must_match():
    with pytest.raises(ValueError, match="^q: "):
        T.kl_divergence([0.5, 0.5], [0.5, 0.7])
    with pytest.raises(ValueError, match="^q: .*shape"):
        T.step_criteria_columns(torch.ones(4) / 4, torch.ones(5) / 5, T.CriteriaConfig())
    with pytest.raises(ValueError, match="^margin"):
        T.margin_bound(1.5, T.Greedy())


# --- engine columns -----------------------------------------------------------------------------


def test_columns_for_the_engine():
    torch.manual_seed(0)
    cfg = T.CriteriaConfig()
    p = torch.softmax(torch.randn(8, 1000) * 3, -1)
    q = torch.softmax(torch.randn(8, 1000) * 3 + torch.log(p) * 0.8, -1)
    nodes = T.node_certificate_columns(p, cfg)
    assert set(nodes) == {
        f"cert_{n}"
        for n in (
            "greedy",
            "additive",
            "multiplicative",
            "top_m",
            "entropy",
            "tree_m1",
            "tree_m2",
            "tree_m4",
            "tree_m8",
        )
    }
    assert all(v.dtype == np.float64 and v.shape == (8,) for v in nodes.values())
    steps = T.step_criteria_columns(p, q, cfg)
    for name in ("greedy", "additive", "multiplicative", "top_m", "entropy"):
        assert steps[f"accept_{name}"].dtype == bool
        np.testing.assert_array_equal(steps[f"cert_{name}"], nodes[f"cert_{name}"])
        certified = steps[f"certified_{name}"]
        assert not (certified & ~steps[f"accept_{name}"]).any()
    for m in (1, 2, 4, 8):
        assert not (steps[f"tree_certified_m{m}"] & ~steps[f"tree_covered_m{m}"]).any()
    np.testing.assert_allclose(steps["kl_target_draft"], T.kl_divergence(p, q))
    one = T.step_criteria_columns(p[0], q[0], cfg)
    assert one["accept_greedy"].shape == (1,)
    assert one["accept_greedy"][0] == (int(q[0].argmax()) == int(p[0].argmax()))
    manifest = {"config": {"criteria": json.loads(json.dumps(cfg.to_dict()))}}
    assert T.criteria_config_from_manifest(manifest) == cfg


def test_one_pass_columns_equal_the_separate_ones():
    """certificate_columns: the nodes' columns are node_certificate_columns', and the step's are
    step_criteria_columns' at the root, with the root row's certificates exactly."""
    torch.manual_seed(1)
    cfg = T.CriteriaConfig()
    p = torch.softmax(torch.randn(5, 3000) * torch.tensor([[4.0], [0.1], [2], [6], [1]]), -1)
    q = torch.softmax(torch.randn(3000) * 3, -1)
    nodes, step = T.certificate_columns(p, q, cfg)
    separate = T.node_certificate_columns(p, cfg)
    assert nodes.keys() == separate.keys()
    for name in nodes:
        np.testing.assert_array_equal(nodes[name], separate[name])
        np.testing.assert_array_equal(step[name], nodes[name][:1])
    alone = T.step_criteria_columns(p[0], q, cfg)
    assert step.keys() == alone.keys()
    for name, values in alone.items():
        if values.dtype == bool:
            np.testing.assert_array_equal(step[name], values)
        else:
            np.testing.assert_allclose(step[name], values, rtol=1e-13)


@pytest.mark.parametrize("scale", [0.02, 1.0, 8.0])
def test_accepted_counts_from_the_sorted_top_equal_the_full_count(scale):
    """n_accepted(d, top) reads the count off the W largest masses unless all of them pass, and
    then counts the whole row: the same counts as a full pass, flat rows and ties included."""
    from specscope.theory.certificates import TOP_WIDTH, _sorted_prefix
    from specscope.theory.criteria import Target, as_probs

    torch.manual_seed(2)
    logits = torch.randn(64, 500) * scale
    logits[:8] = (logits[:8] * 4).round() / 4  # ties
    d = Target(as_probs(torch.softmax(logits, -1), "p")[0])
    top = _sorted_prefix(d.p, TOP_WIDTH)
    for crit in (
        T.Additive(0.1),
        T.Additive(0.01),
        T.Multiplicative(0.5),
        T.Entropy(0.09, 0.3),
        T.Greedy(),
        T.TopM(2),
    ):
        full = crit.n_accepted(d)
        assert torch.equal(crit.n_accepted(d, top), full), crit
    if scale < 1:
        assert (T.Additive(0.1).n_accepted(d) > TOP_WIDTH).all()  # the whole-row path ran


def test_columns_are_fast_for_a_real_vocabulary():
    import time

    p = torch.softmax(torch.randn(8, 151_936) * 4, -1)
    q = torch.softmax(torch.randn(8, 151_936) * 4, -1)
    T.step_criteria_columns(p, q, T.CriteriaConfig())
    start = time.perf_counter()
    T.node_certificate_columns(p, T.CriteriaConfig())
    T.step_criteria_columns(p, q, T.CriteriaConfig())
    assert time.perf_counter() - start < 2.0


# --- certify ------------------------------------------------------------------------------------


def _node_row(run_id, prompt_id, domain, step, node_id, parent, depth, rank, p, q, token):
    s = np.sort(p)[::-1]
    return {
        "run_id": run_id,
        "prompt_id": prompt_id,
        "domain": domain,
        "step": step,
        "position_bin": step // 32,
        "node_id": node_id,
        "parent_id": parent,
        "depth": depth,
        "sibling_rank": rank,
        "token_id": token,
        "p_draft": float(q[token]),
        "p_target": float(p[token]),
        "alpha": min(1.0, float(p[token] / q[token])),
        "greedy_accept": token == int(np.argmax(p)),
        "target_entropy": float(-(p * np.log(p)).sum()),
        "draft_entropy": float(-(q * np.log(q)).sum()),
        "target_top1_prob": float(s[0]),
        "target_margin": float(s[0] - s[1]),
        "kl_target_draft": float(T.kl_divergence(p, q)),
        "target_rank": int((p > p[token]).sum()),
    }


def _complete(row: dict, table: str) -> dict:
    """Fill schema fields this test does not care about with neutral values."""
    neutral = {
        pa.types.is_string: "",
        pa.types.is_boolean: False,
        pa.types.is_integer: 0,
        pa.types.is_floating: 0.0,
        pa.types.is_list: [],
    }
    for f in SCHEMAS[table]:
        if f.name not in row:
            row[f.name] = next(v for test, v in neutral.items() if test(f.type))
    return row


def _write_run(path, with_theory: bool, steps_per_prompt: int = 12):
    rng = np.random.default_rng(7)
    cfg = T.CriteriaConfig()
    writer = RunDir(path)
    for order, (pid, domain) in enumerate([("c0", "code"), ("c1", "code"), ("h0", "chat")]):
        nodes, steps = [], []
        for step in range(steps_per_prompt):
            p = rng.dirichlet(np.full(40, 0.1))
            q = softmax(np.log(p) + rng.normal(size=40) * rng.choice([0.1, 1.0, 3.0]))
            order_q = np.argsort(-q, kind="stable")
            for rank in range(2):
                row = _node_row("r", pid, domain, step, rank, -1, 1, rank, p, q, int(order_q[rank]))
                if with_theory:
                    row.update(
                        {
                            k: float(v[0])
                            for k, v in T.node_certificate_columns(
                                torch.tensor(p)[None], cfg
                            ).items()
                        }
                    )
                nodes.append(row)
            srow = {
                "run_id": "r",
                "prompt_id": pid,
                "domain": domain,
                "step": step,
                "position_bin": 0,
                "context_len": 10 + step,
                "tree_size": 2,
                "emitted_token": int(np.argmax(p)),
                "accepted_len": 0,
                "tau": 1,
                "draft_time_s": 0.0,
                "verify_time_s": 0.0,
                "step_time_s": 0.0,
            }
            if with_theory:
                cols = T.step_criteria_columns(torch.tensor(p), torch.tensor(q), cfg)
                srow.update({k: v[0].item() for k, v in cols.items()})
            steps.append(srow)
        prompt = {
            "run_id": "r",
            "prompt_id": pid,
            "domain": domain,
            "order": order,
            "source": "synthetic",
            "source_index": order,
            "messages_json": "[]",
            "prompt_text": "x",
            "prompt_tokens": 1,
            "truncated": False,
            "generated_tokens": steps_per_prompt,
            "output_token_ids": [1],
            "output_text": "",
            "stop_reason": "max_new_tokens",
            "time_s": 0.0,
        }
        writer.commit_prompt(
            order,
            pid,
            *(
                to_table([_complete(r, name) for r in rows], name)
                for rows, name in ((nodes, "nodes"), (steps, "steps"), ([prompt], "prompts"))
            ),
        )
    writer.consolidate()
    manifest = {"schema_version": 1, "run_id": "r"}
    if with_theory:
        manifest["criteria"] = cfg.to_dict()
    RunDir(path).write_manifest(manifest)
    return path


def test_certify_on_a_synthetic_run(tmp_path):
    run = load_run(_write_run(tmp_path / "run", with_theory=True))
    report = C.certify_run(run)
    assert report.violations == 0
    crit = report.criteria.set_index(["domain", "criterion"])
    assert set(report.criteria["domain"]) == {"all", "chat", "code"}
    assert crit.loc[("all", "greedy"), "n"] == 36
    assert crit.loc[("code", "greedy"), "n"] == 24
    steps = run.steps
    assert crit.loc[("all", "top_m"), "frac_certified"] == pytest.approx(
        steps["certified_top_m"].mean()
    )
    assert crit.loc[("all", "greedy"), "median"] == pytest.approx(steps["cert_greedy"].median())
    for name in ("greedy", "additive", "multiplicative", "top_m", "entropy"):
        assert 0 <= crit.loc[("all", name), "run_max"] <= 12
    tree = report.trees.set_index(["domain", "tree"])
    assert list(report.trees["tree"].unique()) == ["tree_m1", "tree_m2", "tree_m4", "tree_m8"]
    assert (report.trees["median"] <= np.log([2, 3, 5, 9] * 3) + 1e-12).all()
    assert tree.loc[("all", "tree_m8"), "frac_ok"] >= tree.loc[("all", "tree_m1"), "frac_ok"]
    pub = report.published.set_index(["certificate", "statistic"])
    assert pub.loc[("greedy", "median"), "published"] == 0.559
    assert pub.loc[("greedy", "median"), "ours_all"] == pytest.approx(steps["cert_greedy"].median())
    pytest.importorskip("matplotlib")
    paths = C.plot_certificates(report, tmp_path / "plots")
    assert [p.suffix for p in paths] == [".png", ".svg"] and all(p.stat().st_size for p in paths)


def test_certify_rebuilds_greedy_for_runs_without_theory_columns(tmp_path):
    plain = C.certify_run(load_run(_write_run(tmp_path / "plain", with_theory=False)))
    full = C.certify_run(load_run(_write_run(tmp_path / "full", with_theory=True)))
    assert "rebuilt" in plain.source and plain.notes
    a = plain.criteria.set_index(["domain", "criterion"]).loc[("all", "greedy")]
    b = full.criteria.set_index(["domain", "criterion"]).loc[("all", "greedy")]
    for col in ("median", "p5", "frac_ok", "frac_certified", "run_mean", "run_max", "violations"):
        assert a[col] == pytest.approx(b[col], abs=1e-9)
    assert plain.trees.empty


def test_run_lengths_and_quantiles():
    assert C.run_lengths([True, True, False, True, False, False, True, True, True]) == [2, 1, 3]
    assert C.run_lengths([]) == [] and C.run_lengths([False]) == []
    x = np.random.default_rng(0).random(37)
    assert C.quantile(x, 0.05) == pytest.approx(np.quantile(x, 0.05))
    assert C.quantile(np.array([0.1, np.inf, np.inf]), 0.5) == math.inf  # no inf - inf = NaN


def test_certify_cli(tmp_path):
    from typer.testing import CliRunner

    from specscope.cli import app

    run_dir = _write_run(tmp_path / "run", with_theory=True, steps_per_prompt=4)
    result = CliRunner().invoke(
        app, ["certify", str(run_dir), "--out", str(tmp_path / "o"), "--no-plot"]
    )
    assert result.exit_code == 0, result.output
    assert "greedy" in result.output and "soundness: 0" in result.output
    assert (tmp_path / "o" / "certificates.csv").is_file()
    bad = CliRunner().invoke(app, ["certify", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "error:" in bad.output


# --- certify: certified fraction by target-margin bin ----------------------------------------------


def test_margin_bins_are_checked_and_coded():
    edges = C.parse_margin_bins("0,0.1,0.25,0.5,0.75,0.9,1")
    assert edges == C.DEFAULT_MARGIN_BINS
    assert C.margin_bin_labels((0.0, 0.1, 1.0)) == ("[0, 0.1)", "[0.1, 1]")
    codes = C.margin_bin_codes(np.array([0.0, 0.05, 0.1, 0.9999, 1.0, 1.2, -0.1, np.nan]), edges)
    assert codes.tolist() == [0, 0, 1, 5, 5, -1, -1, -1]
    for text, part in (
        ("", "is empty"),
        ("0", "make no bin"),
        ("0,0.5,0.5", "0.5 then 0.5"),
        ("0.5,0.1", "0.5 then 0.1"),
        ("0,1.5", "1.5 lies outside"),
        ("-0.1,1", "-0.1 lies outside"),
        ("0,,1", "'' is not a number"),
        ("0,a,1", "'a' is not a number"),
        ("0,nan", "nan lies outside"),
    ):
        with pytest.raises(C.MarginBinsError) as e:
            C.parse_margin_bins(text)
        message = str(e.value)
        assert part in message and "strictly increasing" in message and "\n" not in message


def test_certified_fraction_by_margin_bin(tmp_path):
    run = load_run(_write_run(tmp_path / "run", with_theory=True))
    edges = (0.0, 0.2, 0.6, 1.0)
    report = C.certify_run(run, edges, n_boot=200, seed=1)
    m = report.margins
    assert m is not None and m.source == "steps" and m.edges == edges
    # tree_m1 certifies what greedy does: left out
    assert m.names == (
        "greedy",
        "additive",
        "multiplicative",
        "top_m",
        "entropy",
        "tree_m2",
        "tree_m4",
        "tree_m8",
    )
    steps = run.steps
    codes = C.margin_bin_codes(steps["target_margin"].to_numpy(), edges)
    for domain in ("all", "code", "chat"):
        rows = [r for r in m.rows if r.domain == domain]
        assert [r.bin for r in rows] == ["[0, 0.2)", "[0.2, 0.6)", "[0.6, 1]"]
        sel = (
            np.ones(len(steps), bool) if domain == "all" else (steps["domain"] == domain).to_numpy()
        )
        for b, r in enumerate(rows):
            in_bin = sel & (codes == b)
            assert r.steps == in_bin.sum()
            assert r.prompts == steps.loc[in_bin, "prompt_id"].nunique()
            for name, est in zip(m.names, r.fractions):
                flag = C.flag_column(name)
                if r.steps:
                    assert est.value == pytest.approx(steps.loc[in_bin, flag].mean())
                else:
                    assert not est.defined
    assert sum(r.steps for r in m.rows if r.domain == "all") + m.outside == len(steps)
    # intervals: over all domains (3 prompts, 2 domains: 1 degree of freedom) they exist and
    # contain the figure; chat has one prompt, so none there
    pooled = [e for r in m.rows if r.domain == "all" and r.prompts == 3 for e in r.fractions]
    assert pooled and any(e.has_interval for e in pooled)
    assert all(e.lo <= e.value <= e.hi for e in pooled if e.has_interval)
    assert not any(e.has_interval for r in m.rows if r.domain == "chat" for e in r.fractions)
    assert all(0 <= e.lo and e.hi <= 1 for r in m.rows for e in r.fractions if e.has_interval)
    # the per-domain summary has intervals too, and the same figures as before
    crit = report.criteria.set_index(["domain", "criterion"])
    row = crit.loc[("all", "top_m")]
    assert row["frac_certified"] == pytest.approx(steps["certified_top_m"].mean())
    assert row["frac_certified_lo"] <= row["frac_certified"] <= row["frac_certified_hi"]
    assert row["frac_ok_lo"] <= row["frac_ok"] <= row["frac_ok_hi"]
    pytest.importorskip("matplotlib")
    paths = C.plot_margin_table(report, tmp_path / "plots")
    assert [p.name for p in paths] == ["certified_by_margin.png", "certified_by_margin.svg"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_margins_of_older_runs_come_from_root_nodes_or_are_refused(tmp_path):
    import pyarrow.parquet as pq

    # steps without target_margin: the root nodes' context is the step's root context
    path = _write_run(tmp_path / "run", with_theory=True)  # read from its parts/
    full = C.certify_run(load_run(path), n_boot=50)
    for part in (path / "parts" / "steps").iterdir():
        pq.write_table(pq.read_table(part).drop_columns(["target_margin"]), part)
    older = C.certify_run(load_run(path), n_boot=50)
    assert "target_margin" not in load_run(path).steps
    assert older.margins.source == "root nodes"
    assert [r.steps for r in older.margins.rows] == [r.steps for r in full.margins.rows]
    assert [e.value for r in older.margins.rows for e in r.fractions] == pytest.approx(
        [e.value for r in full.margins.rows for e in r.fractions], nan_ok=True
    )
    # and without nodes either: a note by default, an error naming the column on request
    for part in (path / "parts" / "nodes").iterdir():
        part.unlink()
    report = C.certify_run(load_run(path), n_boot=50)
    assert report.margins is None and any("target_margin" in n for n in report.notes)
    assert not report.criteria.empty  # the rest of certify still works
    with pytest.raises(C.MarginDataError, match="no target_margin"):
        C.certify_run(load_run(path), n_boot=50, require_margins=True)


def test_certify_cli_margin_table(tmp_path):
    from typer.testing import CliRunner

    from specscope.cli import app

    run_dir = _write_run(tmp_path / "run", with_theory=True, steps_per_prompt=6)
    out = tmp_path / "o"
    result = CliRunner().invoke(
        app,
        ["certify", str(run_dir), "--out", str(out), "--boot", "50", "--margin-bins", "0,0.3,1"],
    )
    assert result.exit_code == 0, result.output
    assert "certified fraction of steps by target margin (all)" in result.output
    assert "[0.3, 1]" in result.output and "multiplicative" in result.output
    assert "…" not in result.output  # nothing cut to the width of a terminal
    csv = (out / "certified_by_margin.csv").read_text().splitlines()
    assert csv[0].startswith("domain,margin,lo,hi,steps,prompts,greedy,greedy lo,greedy hi")
    assert len(csv) == 1 + 3 * 2  # all, chat, code x 2 bins
    md = (out / "certified_by_margin.md").read_text()
    assert "| \\[0, 0.3) |" in md and "(chat)" in md  # brackets escaped for Markdown
    if importlib.util.find_spec("matplotlib"):
        assert (out / "certified_by_margin.png").stat().st_size > 1000
    for bins in ("0,0.5,0.5", "", "0.2"):
        bad = CliRunner().invoke(app, ["certify", str(run_dir), "--margin-bins", bins])
        assert bad.exit_code == 2, bad.output
        lines = bad.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --margin-bins")


def test_certified_fraction_intervals_cover_the_truth():
    """Calibration of the certified-fraction intervals on worlds of known truth: 4 domains of 10
    prompts, each prompt with its own certification rate (Beta(2, 2), mean 0.5) and 20 steps;
    the 95% intervals must cover 0.5 about 95% of the time."""
    rng = np.random.default_rng(11)
    worlds, covered, widths = 300, 0, []
    prompts, steps = 40, 20
    frame = pd.DataFrame(
        {
            "prompt_id": np.repeat([f"p{i:02d}" for i in range(prompts)], steps),
            "domain": np.repeat([f"d{i % 4}" for i in range(prompts)], steps),
        }
    )
    cell = np.zeros(len(frame), np.int64)
    for world in range(worlds):
        rates = np.repeat(rng.beta(2, 2, prompts), steps)
        flags = (rng.random(len(frame)) < rates).astype(float)
        clusters = C.StepClusters.of(frame, 300, world, 0.95)
        est = clusters.fractions(flags, cell, 1)[0][0, 0]
        covered += est.contains(0.5)
        widths.append(est.hi - est.lo)
    assert 0.91 <= covered / worlds <= 0.985, covered / worlds
    assert 0.1 < np.mean(widths) < 0.3
