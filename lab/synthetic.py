"""Synthetic run directories: records with a known structure, for tests, benchmarks and demos.

The records follow the run format of :mod:`specscope.records` exactly. Acceptance is simulated,
not measured: each parent context has at most one greedy-accepted child (the draft's rank-0 or
rank-1 token, or neither), with domain-dependent odds that fall with the target entropy and vary
from prompt to prompt (so nodes of one prompt are correlated, as in real runs). Nothing here reads
a model.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specscope.records import SCHEMA_VERSION, SCHEMAS, TABLES, RunDir, position_bin, to_table

# The paper's tree: 2 roots, 4 nodes at depth 2, 2 at depth 3.
PAPER_PARENTS = (-1, -1, 0, 0, 1, 1, 2, 2)
PAPER_RANKS = (0, 1, 0, 1, 0, 1, 0, 1)


@dataclass(frozen=True)
class DomainProfile:
    """How acceptance behaves in one synthetic domain."""

    top: float  # P(the draft's rank-0 token is the target's greedy token), at mean entropy
    second: float  # P(rank-1 is), given rank-0 is not
    entropy: float  # mean target entropy, nats


PROFILES = {
    "chat": DomainProfile(0.62, 0.30, 1.25),
    "code": DomainProfile(0.58, 0.25, 0.89),
    "math": DomainProfile(0.50, 0.22, 1.15),
    "reasoning": DomainProfile(0.55, 0.24, 0.89),
}

ESCAPE_PROBE = '<script>alert("x")</script> & <b>bold</b>'  # tests check the report escapes it


def _table(columns: dict, name: str):
    """A table of the named schema; schema columns not simulated here are left null."""
    n = len(next(iter(columns.values())))
    for field in SCHEMAS[name]:
        columns.setdefault(field.name, [None] * n)
    return to_table(columns, name)


def _steps_table(
    run_id: str,
    prompt_id: np.ndarray,
    domain: np.ndarray,
    step: np.ndarray,
    tree_size: np.ndarray,
    emitted: np.ndarray,
    accepted_len: np.ndarray,
    drafter: str | None = None,
):
    """The step records of a synthetic run, one row per step (constant timings)."""
    S = len(step)
    columns = {
        "run_id": [run_id] * S,
        "prompt_id": prompt_id,
        "domain": domain,
        "step": step.astype(np.int32),
        "position_bin": position_bin(step).astype(np.int8),
        "context_len": (100 + step).astype(np.int32),
        "tree_size": tree_size.astype(np.int16),
        "emitted_token": emitted,
        "accepted_len": accepted_len.astype(np.int16),
        "tau": (accepted_len + 1).astype(np.int16),
        "draft_time_s": np.full(S, 0.01),
        "verify_time_s": np.full(S, 0.02),
        "step_time_s": np.full(S, 0.03),
    }
    if drafter is not None:
        columns["drafter"] = [drafter] * S
    return _table(columns, "steps")


def _depths(parents: tuple[int, ...]) -> np.ndarray:
    depth = np.zeros(len(parents), np.int64)
    for i, p in enumerate(parents):
        depth[i] = 1 if p < 0 else depth[p] + 1
    return depth


def _schedule(
    rng: np.random.Generator, n_domains: int, prompts_per_domain: int, steps: int | tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each prompt's domain and number of steps (``steps``, or drawn uniformly from the inclusive
    range ``(lo, hi)``), and each step's prompt and index within it."""
    prompt_domain = np.repeat(np.arange(n_domains), prompts_per_domain)
    if isinstance(steps, tuple):
        n_steps = rng.integers(steps[0], steps[1] + 1, size=len(prompt_domain))
    else:
        n_steps = np.full(len(prompt_domain), steps)
    step_prompt = np.repeat(np.arange(len(prompt_domain)), n_steps)
    step_index = np.concatenate([np.arange(n) for n in n_steps])
    return prompt_domain, n_steps, step_prompt, step_index


def _prompts_table(run_id: str, prompt_ids, domains, prompt_domain, n_steps):
    """The prompts table of a synthetic run: one row per prompt, ``n_steps[i]`` tokens generated."""
    P = len(prompt_ids)
    return _table(
        {
            "run_id": [run_id] * P,
            "prompt_id": list(prompt_ids),
            "domain": [domains[d] for d in prompt_domain],
            "order": np.arange(P, dtype=np.int32),
            "source": ["synthetic"] * P,
            "source_index": np.arange(P, dtype=np.int64),
            "messages_json": ["[]"] * P,
            "prompt_text": [
                f"Synthetic {domains[d]} prompt {i}. {ESCAPE_PROBE}"
                for i, d in enumerate(prompt_domain)
            ],
            "prompt_tokens": np.full(P, 32, np.int32),
            "truncated": np.zeros(P, bool),
            "generated_tokens": n_steps.astype(np.int32),
            "output_token_ids": [[0] * int(n) for n in n_steps],
            "output_text": [f"output {i} <end>" for i in range(P)],
            "stop_reason": ["max_new_tokens"] * P,
            "time_s": n_steps * 0.03,
        },
        "prompts",
    )


def synthetic_tables(
    prompts_per_domain: int = 50,
    steps: int | tuple[int, int] = 64,
    seed: int = 0,
    profiles: dict[str, DomainProfile] | None = None,
    parents: tuple[int, ...] = PAPER_PARENTS,
    ranks: tuple[int, ...] = PAPER_RANKS,
    run_id: str = "synthetic",
    prompt_sd: float = 0.35,
    depth_effect: float = 0.0,
    entropy_effect: float = 0.6,
    second_depth_effect: float = 0.0,
    second_entropy_effect: float = 0.0,
    shared_context: bool = False,
):
    """(nodes, steps, prompts) pyarrow tables of a synthetic run.

    ``steps`` is the number of generation steps per prompt, or a (low, high) range to draw from
    (prompts that stop at EOS early). The log-odds that the draft's top token is the target's
    greedy token are the domain's, plus a prompt effect ~ N(0, ``prompt_sd``), plus
    ``depth_effect`` per depth below the roots, minus ``entropy_effect`` per nat of target entropy
    above the domain's mean: every effect is known, which is what the calibration of the findings'
    verdicts needs (``tests/test_calibration.py``). The rank-1 token wins only where the rank-0
    token does not, so these effects run the *other* way at rank 1 (a Simpson's paradox across
    sibling ranks); ``second_depth_effect`` and ``second_entropy_effect`` act likewise on the
    log-odds of the rank-1 token (given rank 0 is not the greedy token), so that an effect can
    hold at every rank. Siblings are drawn with their own target entropy unless
    ``shared_context`` (then they share it, as real siblings share their parent's context: the
    rank-1 node's acceptance then depends on its own recorded entropy).
    """
    profiles = PROFILES if profiles is None else profiles
    rng = np.random.default_rng(seed)
    parents_a, ranks_a, depth = np.array(parents), np.array(ranks), _depths(parents)
    K = len(parents)
    domains = sorted(profiles)
    prompt_domain, n_steps, step_prompt, step_index = _schedule(
        rng, len(domains), prompts_per_domain, steps
    )
    P = len(prompt_domain)
    S = len(step_prompt)
    step_domain = prompt_domain[step_prompt]

    top = np.array([profiles[d].top for d in domains])[step_domain]
    second = np.array([profiles[d].second for d in domains])[step_domain]
    mean_h = np.array([profiles[d].entropy for d in domains])[step_domain]
    prompt_effect = rng.normal(0, prompt_sd, size=P)[step_prompt]

    # Per (step, node): target entropy, then which child of each parent is the greedy token.
    entropy = rng.gamma(2.0, 1.0, size=(S, K)) * (mean_h / 2.0)[:, None]
    group_first = {}
    for k, p in enumerate(parents):
        group_first.setdefault(p, k)
    first = np.array([group_first[p] for p in parents])
    if shared_context:
        entropy = entropy[:, first]
    logit = (
        (np.log(top / (1 - top)) + prompt_effect)[:, None]
        + depth_effect * (depth - 1)[None, :]
        - entropy_effect * (entropy - mean_h[:, None])
    )
    p0 = 1 / (1 + np.exp(-logit))
    u = rng.random((S, K))  # one draw per (step, parent group); indexed by the group's first child
    draw, p0g = u[:, first], p0[:, first]
    second_g = second[:, None]
    if second_depth_effect or second_entropy_effect:
        second_logit = (
            np.log(second / (1 - second))[:, None]
            + second_depth_effect * (depth - 1)[None, :]
            - second_entropy_effect * (entropy - mean_h[:, None])
        )
        second_g = (1 / (1 + np.exp(-second_logit)))[:, first]
    winner = np.where(draw < p0g, 0, np.where(draw < p0g + (1 - p0g) * second_g, 1, -1))
    greedy = winner == ranks_a[None, :]

    accept_draw = rng.random((S, K))
    alpha = np.where(
        greedy,
        np.where(accept_draw < 0.7, 1.0, rng.beta(4.0, 1.5, size=(S, K))),
        np.where(accept_draw < 0.12, 1.0, rng.beta(1.0, 2.5, size=(S, K))),
    )
    p_draft = rng.uniform(0.05, 0.95, size=(S, K))
    p_target = np.minimum(alpha * p_draft, 1.0)

    path = np.zeros((S, K), bool)
    for k in range(K):
        path[:, k] = greedy[:, k] & (True if parents[k] < 0 else path[:, parents[k]])
    accepted_len = (path * depth[None, :]).max(axis=1)

    prompt_ids = np.array(
        [f"{domains[d]}-{i:04d}" for i, d in enumerate(prompt_domain)], dtype=object
    )
    node_prompt = np.repeat(step_prompt, K)
    node_step = np.repeat(step_index, K)
    nodes = _table(
        {
            "run_id": [run_id] * (S * K),
            "prompt_id": prompt_ids[node_prompt],
            "domain": np.array(domains, dtype=object)[prompt_domain[node_prompt]],
            "step": node_step.astype(np.int32),
            "position_bin": position_bin(node_step).astype(np.int8),
            "node_id": np.tile(np.arange(K), S).astype(np.int16),
            "parent_id": np.tile(parents_a, S).astype(np.int16),
            "depth": np.tile(depth, S).astype(np.int8),
            "sibling_rank": np.tile(ranks_a, S).astype(np.int16),
            "token_id": rng.integers(0, 32000, size=S * K).astype(np.int32),
            "p_draft": p_draft.ravel(),
            "p_target": p_target.ravel(),
            "alpha": alpha.ravel(),
            "greedy_accept": greedy.ravel(),
            "target_entropy": entropy.ravel(),
            "draft_entropy": (entropy * rng.uniform(0.8, 1.2, size=(S, K))).ravel(),
            "target_top1_prob": np.exp(-entropy).ravel(),
            "target_margin": (np.exp(-entropy) / 2).ravel(),
            "kl_target_draft": rng.gamma(1.0, 0.3, size=S * K),
            "target_rank": np.where(greedy, 0, rng.integers(1, 50, size=(S, K)))
            .ravel()
            .astype(np.int32),
        },
        "nodes",
    )
    steps_table = _steps_table(
        run_id,
        prompt_ids[step_prompt],
        np.array(domains, dtype=object)[step_domain],
        step_index,
        np.full(S, K),
        rng.integers(0, 32000, size=S).astype(np.int32),
        accepted_len,
    )
    prompts = _prompts_table(run_id, prompt_ids, domains, prompt_domain, n_steps)
    return nodes, steps_table, prompts


def _write_run(run_dir: str | Path, tables, run_id: str, config: dict) -> Path:
    """A complete run directory of the (nodes, steps, prompts) ``tables``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir = RunDir(run_dir)
    for name, table in zip(TABLES, tables):
        rundir.write_table(name, table)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "status": "complete",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": {"synthetic": True, **config},
        "counts": {name: t.num_rows for name, t in zip(TABLES, tables)},
    }
    rundir.write_manifest(manifest)
    return run_dir


def write_synthetic_run(run_dir: str | Path, **kwargs) -> Path:
    """Write a complete synthetic run directory; keyword arguments go to synthetic_tables."""
    config = {
        "tree": "paper",
        "seed": kwargs.get("seed", 0),
        "prompts_per_domain": kwargs.get("prompts_per_domain", 50),
    }
    return _write_run(
        run_dir, synthetic_tables(**kwargs), kwargs.get("run_id", "synthetic"), config
    )


# --- drafters side by side --------------------------------------------------------------------------

DRAFTER_DOMAINS = ("chat", "code", "math", "reasoning")


@dataclass(frozen=True)
class DrafterProfile:
    """How one synthetic drafter behaves at every step of every prompt.

    It proposes a chain of ``depth`` tokens with probability ``propose`` (below 1: a model-free
    lookup that finds no match proposes nothing; its log-odds vary from prompt to prompt), and
    each node of the chain is greedy-accepted, given its parent is, with log-odds
    logit(``accept``) plus the prompt's effect, which every drafter shares (a prompt easy for one
    drafter is easy for all). ``matches`` names an earlier drafter instead of ``accept``: each
    prompt's acceptance is then solved so that this drafter's expected tau equals that drafter's
    at every prompt (equal tau, different structure). ``point_mass``: p_draft = 1 and
    alpha = p_target, no draft entropy and no KL, as the ngram drafter records.
    """

    accept: float | None = None
    propose: float = 1.0
    depth: int = 4
    point_mass: bool = False
    matches: str | None = None

    def __post_init__(self) -> None:
        if (self.accept is None) == (self.matches is None):
            raise ValueError("a DrafterProfile takes accept or matches, exactly one of them")
        if self.accept is not None and not 0 < self.accept < 1:
            raise ValueError(f"accept must be in (0, 1), got {self.accept}")
        if not 0 < self.propose <= 1 or self.depth < 1:
            raise ValueError("propose must be in (0, 1] and depth at least 1")


def chain_expected_length(accept: np.ndarray, depth: int) -> np.ndarray:
    """Expected accepted length of a chain of ``depth`` nodes, each accepted given its parent
    with probability ``accept``: sum over d = 1..depth of accept**d (tau is one more)."""
    accept = np.asarray(accept, dtype=float)
    return sum(accept**d for d in range(1, depth + 1))


def _solve_accept(length: np.ndarray, depth: int) -> np.ndarray:
    """The per-node acceptance whose chain of ``depth`` has expected accepted length ``length``."""
    if (length > depth).any() or (length < 0).any():
        raise ValueError(
            f"no chain of depth {depth} has an expected accepted length of {length.max():.3f}: "
            "a deeper chain, or a drafter that proposes more often, can match"
        )
    lo, hi = np.zeros_like(length), np.ones_like(length)
    for _ in range(60):  # bisection: chain_expected_length rises with the acceptance
        mid = (lo + hi) / 2
        low = chain_expected_length(mid, depth) < length
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    return (lo + hi) / 2


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


def drafter_rates(
    drafters: dict[str, DrafterProfile],
    prompt_effect: np.ndarray,
    rng: np.random.Generator,
    propose_sd: float = 0.5,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each drafter's probabilities per prompt: (of proposing at a step, of a chain node being
    accepted given its parent), for prompts of the given effects on the log-odds of acceptance.
    A drafter's expected tau at a prompt is ``1 + propose * chain_expected_length(accept, depth)``.
    """
    P = len(prompt_effect)
    expected: dict[str, np.ndarray] = {}
    out = {}
    for label, profile in drafters.items():
        propose = np.ones(P)
        if profile.propose < 1:
            propose = _logistic(_logit(profile.propose) + rng.normal(0, propose_sd, size=P))
        if profile.matches is None:
            accept = _logistic(_logit(profile.accept) + prompt_effect)
        elif profile.matches in expected:
            accept = _solve_accept(expected[profile.matches] / propose, profile.depth)
        else:
            raise ValueError(
                f"{label} matches {profile.matches!r}, which is not an earlier drafter"
            )
        expected[label] = propose * chain_expected_length(accept, profile.depth)
        out[label] = (propose, accept)
    return out


def synthetic_drafter_tables(
    drafters: dict[str, DrafterProfile],
    prompts_per_domain: int = 50,
    steps: int | tuple[int, int] = 64,
    seed: int = 0,
    domains: tuple[str, ...] = DRAFTER_DOMAINS,
    prompt_sd: float = 0.35,
    propose_sd: float = 0.5,
    run_id: str = "synthetic",
) -> dict[str, tuple]:
    """(nodes, steps, prompts) tables of one run per drafter (keyed by its label, which the
    records' ``drafter`` column carries), measured on the same prompts: the same prompt ids, the
    same number of steps per prompt and the same emitted tokens, as greedy verification gives
    every drafter the target's trajectory. Drafter ``i``'s run id is ``{run_id}-{i}``.

    Each drafter is a :class:`DrafterProfile`; the prompts' effects (normal, sd ``prompt_sd``, on
    the log-odds of acceptance) are shared, the proposal log-odds of a drafter with ``propose``
    below 1 vary by prompt with sd ``propose_sd``. A step without a proposal records no nodes,
    tree_size 0 and tau 1. Every expected tau is known (:func:`chain_expected_length`), which is
    what the calibration of the drafter comparison needs.
    """
    rng = np.random.default_rng(seed)
    domains = tuple(sorted(domains))
    prompt_domain, n_steps, step_prompt, step_index = _schedule(
        rng, len(domains), prompts_per_domain, steps
    )
    P = len(prompt_domain)
    prompt_ids = np.array(
        [f"{domains[d]}-{i:04d}" for i, d in enumerate(prompt_domain)], dtype=object
    )
    prompt_effect = rng.normal(0, prompt_sd, size=P)
    emitted = rng.integers(0, 32000, size=len(step_prompt)).astype(np.int32)
    rates = drafter_rates(drafters, prompt_effect, rng, propose_sd)
    schedule = (prompt_ids, domains, prompt_domain, n_steps, step_prompt, step_index, emitted)
    out = {}
    for i, (label, profile) in enumerate(drafters.items()):
        propose, accept = rates[label]
        out[label] = _drafter_run(rng, f"{run_id}-{i}", label, profile, accept, propose, schedule)
    return out


def _drafter_run(rng, run_id, label, profile, accept, propose, schedule) -> tuple:
    """One drafter's (nodes, steps, prompts) tables over the shared schedule of steps."""
    prompt_ids, domains, prompt_domain, n_steps, step_prompt, step_index, emitted = schedule
    S, D = len(step_prompt), profile.depth
    proposes = rng.random(S) < propose[step_prompt]
    greedy = rng.random((S, D)) < accept[step_prompt][:, None]
    accepted_len = np.where(proposes, np.cumprod(greedy, axis=1).sum(axis=1), 0)

    rows = np.flatnonzero(proposes)  # steps that proposed: D nodes each, a chain
    N = len(rows) * D
    node_row = np.repeat(rows, D)
    depth = np.tile(np.arange(1, D + 1), len(rows))
    g = greedy[rows].ravel()
    accept_draw = rng.random(N)
    alpha = np.where(
        g,
        np.where(accept_draw < 0.7, 1.0, rng.beta(4.0, 1.5, size=N)),
        np.where(accept_draw < 0.12, 1.0, rng.beta(1.0, 2.5, size=N)),
    )
    entropy = rng.gamma(2.0, 0.5, size=N)
    if profile.point_mass:  # q(t) = 1: alpha is p_target; no draft entropy, KL undefined
        p_draft, draft_entropy, kl = np.ones(N), np.zeros(N), np.full(N, np.nan)
    else:
        p_draft = rng.uniform(0.05, 0.95, size=N)
        draft_entropy = entropy * rng.uniform(0.8, 1.2, size=N)
        kl = rng.gamma(1.0, 0.3, size=N)
    node_prompt = step_prompt[node_row]
    step_domain = np.array(domains, dtype=object)[prompt_domain[step_prompt]]
    nodes = _table(
        {
            "run_id": [run_id] * N,
            "prompt_id": prompt_ids[node_prompt],
            "domain": step_domain[node_row],
            "drafter": [label] * N,
            "step": step_index[node_row].astype(np.int32),
            "position_bin": position_bin(step_index[node_row]).astype(np.int8),
            "node_id": (depth - 1).astype(np.int16),
            "parent_id": (depth - 2).astype(np.int16),
            "depth": depth.astype(np.int8),
            "sibling_rank": np.zeros(N, np.int16),
            "token_id": rng.integers(0, 32000, size=N).astype(np.int32),
            "p_draft": p_draft,
            "p_target": np.minimum(alpha * p_draft, 1.0),
            "alpha": alpha,
            "greedy_accept": g,
            "target_entropy": entropy,
            "draft_entropy": draft_entropy,
            "target_top1_prob": np.exp(-entropy),
            "target_margin": np.exp(-entropy) / 2,
            "kl_target_draft": kl,
            "target_rank": np.where(g, 0, rng.integers(1, 50, size=N)).astype(np.int32),
        },
        "nodes",
    )
    steps_table = _steps_table(
        run_id,
        prompt_ids[step_prompt],
        step_domain,
        step_index,
        np.where(proposes, D, 0),
        emitted,
        accepted_len,
        drafter=label,
    )
    prompts = _prompts_table(run_id, prompt_ids, domains, prompt_domain, n_steps)
    return nodes, steps_table, prompts


def write_synthetic_drafter_runs(
    out_dir: str | Path, drafters: dict[str, DrafterProfile], **kwargs
) -> dict[str, Path]:
    """One run directory per drafter under ``out_dir`` (``0-draft-model``, ``1-ngram``, ...);
    keyword arguments go to :func:`synthetic_drafter_tables`."""
    tables = synthetic_drafter_tables(drafters, **kwargs)
    run_id = kwargs.get("run_id", "synthetic")
    config = {
        "seed": kwargs.get("seed", 0),
        "prompts_per_domain": kwargs.get("prompts_per_domain", 50),
    }
    return {
        label: _write_run(
            Path(out_dir) / f"{i}-{label.split('(')[0]}",
            t,
            f"{run_id}-{i}",
            {**config, "drafter": label},
        )
        for i, (label, t) in enumerate(tables.items())
    }


# --- tokens per step at known shares: a chain whose acceptance differs by domain and prompt -------


def synthetic_chain_tables(
    domain_accept: dict[str, float],
    depth: int = 4,
    prompts_per_domain: int = 50,
    steps: int = 64,
    seed: int = 0,
    prompt_sd: float = 0.35,
    run_id: str = "synthetic",
) -> tuple:
    """(nodes, steps, prompts) tables of a chain drafter of ``depth`` nodes whose every node is
    greedy-accepted, given its parent is, with log-odds logit(``domain_accept[domain]``) plus the
    prompt's effect ~ N(0, ``prompt_sd``). Every prompt has ``steps`` steps. The shares of the
    variance of tau that domain, prompt and step explain are then known
    (:func:`chain_tau_shares`), which is what the calibration of the level-wise variance
    decomposition (:mod:`specscope.analysis.levels`) needs. The other generators' draws are untouched."""
    rng = np.random.default_rng(seed)
    domains = tuple(sorted(domain_accept))
    prompt_domain, n_steps, step_prompt, step_index = _schedule(
        rng, len(domains), prompts_per_domain, steps
    )
    P = len(prompt_domain)
    prompt_ids = np.array(
        [f"{domains[d]}-{i:04d}" for i, d in enumerate(prompt_domain)], dtype=object
    )
    base = np.array([_logit(domain_accept[d]) for d in domains])[prompt_domain]
    accept = _logistic(base + rng.normal(0, prompt_sd, size=P))
    emitted = rng.integers(0, 32000, size=len(step_prompt)).astype(np.int32)
    schedule = (prompt_ids, domains, prompt_domain, n_steps, step_prompt, step_index, emitted)
    profile = DrafterProfile(accept=0.5, depth=depth)  # only its depth is read: accept is given
    return _drafter_run(rng, run_id, "chain", profile, accept, np.ones(P), schedule)


@dataclass(frozen=True)
class TauShares:
    """Population shares of the variance of tau (``accepted_len + 1``) of a synthetic chain run:
    between domains, between prompts of one domain, and between steps of one prompt (they sum to
    1); and the domain's share of the variance of a prompt's mean tau over its steps."""

    domain: float
    prompt: float
    within: float
    prompt_mean_domain: float


def chain_tau_shares(
    domain_accept: dict[str, float],
    depth: int,
    prompt_sd: float,
    steps: int,
    points: int = 80,
) -> TauShares:
    """The :class:`TauShares` of :func:`synthetic_chain_tables` with the same arguments (equal
    prompts per domain, ``steps`` steps per prompt), exact up to Gauss-Hermite quadrature of the
    prompt effect with ``points`` points. Given a prompt's acceptance ``a``, the accepted length
    ``L`` is ``l < depth`` with probability ``a**l (1 - a)`` and ``depth`` with ``a**depth``."""
    x, w = np.polynomial.hermite_e.hermegauss(points)
    w = w / w.sum()
    lengths = np.arange(depth + 1)
    means, prompt_vars, step_vars = [], [], []
    for d in sorted(domain_accept):
        a = _logistic(_logit(domain_accept[d]) + prompt_sd * x)[:, None]  # (points, 1)
        p = np.where(lengths < depth, a**lengths * (1 - a), a**depth)  # P(L = l | a)
        m = (p * lengths).sum(axis=1)
        v = (p * lengths**2).sum(axis=1) - m**2
        mean = float(w @ m)
        means.append(mean)
        prompt_vars.append(float(w @ (m - mean) ** 2))
        step_vars.append(float(w @ v))
    between = float(np.var(means))
    prompt, within = float(np.mean(prompt_vars)), float(np.mean(step_vars))
    total = between + prompt + within
    return TauShares(
        between / total,
        prompt / total,
        within / total,
        between / (between + prompt + within / steps),
    )


# --- acceptance predictors of known quality ------------------------------------------------------


@dataclass(frozen=True)
class PredictorProfile:
    """A chain drafter whose every node's greedy acceptance is Bernoulli(p_draft ** ``power``),
    independently of everything else given its draft probability.

    Each prompt is of one of the ``mixes`` (drawn uniformly): its nodes' draft probabilities are
    Beta(a, b) with that mix's (a, b), so nodes of one prompt are alike (the scored rows are
    clustered by prompt). ``power`` < 1 makes the draft probability, read as a probability of
    acceptance, too low (a known calibration error). Every other signal is noise.
    """

    power: float = 0.6
    mixes: tuple[tuple[float, float], ...] = ((2.0, 2.0), (4.0, 1.5), (1.2, 3.0))
    depth: int = 4

    def __post_init__(self) -> None:
        if self.power <= 0 or self.depth < 1 or not self.mixes:
            raise ValueError("power must be > 0, depth at least 1, and mixes not empty")
        if any(a <= 0 or b <= 0 for a, b in self.mixes):
            raise ValueError(f"every Beta mix needs a, b > 0, got {self.mixes}")


def predictor_draws(
    rng: np.random.Generator, profile: PredictorProfile, step_prompt: np.ndarray, n_prompts: int
) -> tuple[np.ndarray, np.ndarray]:
    """(S, depth) draft probabilities and greedy acceptances of the steps of ``step_prompt``.
    The same draws, at a large number of prompts, give the population's metrics: the truth the
    scorecard's estimates are checked against."""
    mix = rng.integers(0, len(profile.mixes), size=n_prompts)[step_prompt]
    a, b = np.array(profile.mixes, dtype=float).T
    shape = (len(step_prompt), profile.depth)
    p_draft = rng.beta(a[mix][:, None] * np.ones(shape), b[mix][:, None] * np.ones(shape))
    greedy = rng.random(shape) < p_draft**profile.power
    return p_draft, greedy


def synthetic_predictor_tables(
    profile: PredictorProfile | None = None,
    prompts_per_domain: int = 20,
    steps: int = 32,
    seed: int = 0,
    domains: tuple[str, ...] = ("code", "math"),
    run_id: str = "synthetic",
) -> tuple:
    """(nodes, steps, prompts) tables of a chain drafter whose acceptance follows a
    :class:`PredictorProfile`: the true quality of the draft probability as a predictor of
    acceptance is known (:func:`predictor_draws` at a large sample), which is what the
    calibration of the predictor scorecard (:mod:`specscope.analysis.scorecard`) needs. The other generators'
    draws are untouched."""
    profile = profile or PredictorProfile()
    rng = np.random.default_rng(seed)
    domains = tuple(sorted(domains))
    prompt_domain, n_steps, step_prompt, step_index = _schedule(
        rng, len(domains), prompts_per_domain, steps
    )
    prompt_ids = np.array(
        [f"{domains[d]}-{i:04d}" for i, d in enumerate(prompt_domain)], dtype=object
    )
    p_draft, greedy = predictor_draws(rng, profile, step_prompt, len(prompt_domain))
    S, D = p_draft.shape
    N = S * D
    node_row = np.repeat(np.arange(S), D)
    depth = np.tile(np.arange(1, D + 1), S)
    g = greedy.ravel()
    entropy = rng.gamma(2.0, 0.5, size=N)
    alpha = np.where(g, 1.0, rng.uniform(0.0, 1.0, size=N))
    step_domain = np.array(domains, dtype=object)[prompt_domain[step_prompt]]
    nodes = _table(
        {
            "run_id": [run_id] * N,
            "prompt_id": prompt_ids[step_prompt[node_row]],
            "domain": step_domain[node_row],
            "step": step_index[node_row].astype(np.int32),
            "position_bin": position_bin(step_index[node_row]).astype(np.int8),
            "node_id": (depth - 1).astype(np.int16),
            "parent_id": (depth - 2).astype(np.int16),
            "depth": depth.astype(np.int8),
            "sibling_rank": np.zeros(N, np.int16),
            "token_id": rng.integers(0, 32000, size=N).astype(np.int32),
            "p_draft": p_draft.ravel(),
            "p_target": np.minimum(alpha * p_draft.ravel(), 1.0),
            "alpha": alpha,
            "greedy_accept": g,
            "target_entropy": entropy,
            "draft_entropy": rng.gamma(2.0, 0.5, size=N),
            "target_top1_prob": np.exp(-entropy),
            "target_margin": np.exp(-entropy) / 2,
            "kl_target_draft": rng.gamma(1.0, 0.3, size=N),
            "target_rank": np.where(g, 0, rng.integers(1, 50, size=N)).astype(np.int32),
        },
        "nodes",
    )
    steps_table = _steps_table(
        run_id,
        prompt_ids[step_prompt],
        step_domain,
        step_index,
        np.full(S, D),
        rng.integers(0, 32000, size=S).astype(np.int32),
        np.cumprod(greedy, axis=1).sum(axis=1),
    )
    prompts = _prompts_table(run_id, prompt_ids, domains, prompt_domain, n_steps)
    return nodes, steps_table, prompts


# --- stop rules' records of known truth (specscope.analysis.budgets) -----------------------------

STOP_WORLDS = ("equal", "noise", "informative")


def synthetic_stop_frames(
    world: str, prompts_per_domain: int, seed: int, steps: int = 24, depth: int = 3,
    domains: tuple[str, ...] = ("chat", "code", "math", "reasoning"),
) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """Node and step records of top-1 chains of ``depth`` nodes whose truth is known.

    Each prompt draws its acceptance rate (Beta around 0.6, the same in every domain); each node
    is greedy-accepted with that rate (worlds "equal" and "noise") or with its draft probability
    (world "informative": the draft is calibrated, so a stop on it cuts the nodes likely to fail).
    In "equal" the draft probability and entropy are one constant: every stop rule either keeps
    every node or none, so the stop families hold no setting that differs from a plain chain but
    stopping at the first node (dominated), the domains are alike, and at each chain's cost level
    the stop family and the per-domain budget are equal by construction. In "noise" the draft
    probability is uniform and unrelated to acceptance: every stop cuts nodes at random and pays
    the stopped node's pass, so no stop beats the chains, and again the two are equal (the stop
    family now has the more settings to choose from).
    """
    if world not in STOP_WORLDS:
        raise ValueError(f"unknown world {world!r}: one of {', '.join(STOP_WORLDS)}")
    rng = np.random.default_rng(seed)
    node_rows, step_rows = [], []
    for d in domains:
        for j in range(prompts_per_domain):
            rate = rng.beta(6.0, 4.0)
            pid = f"{d}-{j}"
            for i in range(steps):
                if world == "equal":
                    p = np.full(depth, 0.5)
                    ok = rng.random(depth) < rate
                elif world == "noise":
                    p = rng.random(depth)
                    ok = rng.random(depth) < rate
                else:
                    p = rng.beta(0.6 * rate / (1 - rate), 0.6, size=depth)
                    ok = rng.random(depth) < p
                accepted = int(np.argmin(np.r_[ok, False]))
                step_rows.append((pid, d, i, accepted, depth))
                for k in range(depth):
                    node_rows.append((pid, i, k, k - 1, k + 1, 0, bool(ok[k]), p[k], 1.0 - p[k]))
    nodes = pd.DataFrame(
        node_rows,
        columns=[
            "prompt_id", "step", "node_id", "parent_id", "depth", "sibling_rank",
            "greedy_accept", "p_draft", "draft_entropy",
        ],
    )  # fmt: skip
    steps_frame = pd.DataFrame(
        step_rows, columns=["prompt_id", "domain", "step", "accepted_len", "tree_size"]
    )
    return nodes, steps_frame


# --- engine logs of known truth (specscope.analysis.stepwise) ----------------------------------


def synthetic_requests(
    rng: np.random.Generator, means: dict[str, float], prompts: int, steps: int = 30, k: int = 3
) -> pd.DataFrame:
    """Logged requests of chains of K whose acceptance rate varies from prompt to prompt around
    each domain's mean (Beta with 8 pseudo-counts): the truth is known by construction."""
    rows = []
    for domain, mean in means.items():
        for p in range(prompts):
            rate = rng.beta(mean * 8, (1 - mean) * 8)
            accepted = rng.binomial(k, rate, size=steps)
            rows.append(
                {
                    "prompt_id": f"{domain}{p}",
                    "domain": domain,
                    "steps": steps,
                    "accepted": int(accepted.sum()),
                    "drafted": k * steps,
                }
            )
    return pd.DataFrame(rows)
