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

from ..records import SCHEMA_VERSION, SCHEMAS, TABLES, RunDir, position_bin, to_table

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


def _depths(parents: tuple[int, ...]) -> np.ndarray:
    depth = np.zeros(len(parents), np.int64)
    for i, p in enumerate(parents):
        depth[i] = 1 if p < 0 else depth[p] + 1
    return depth


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
    prompt_domain = np.repeat(np.arange(len(domains)), prompts_per_domain)
    P = len(prompt_domain)
    if isinstance(steps, tuple):
        n_steps = rng.integers(steps[0], steps[1] + 1, size=P)
    else:
        n_steps = np.full(P, steps)
    step_prompt = np.repeat(np.arange(P), n_steps)
    step_index = np.concatenate([np.arange(n) for n in n_steps])
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
    steps_table = _table(
        {
            "run_id": [run_id] * S,
            "prompt_id": prompt_ids[step_prompt],
            "domain": np.array(domains, dtype=object)[step_domain],
            "step": step_index.astype(np.int32),
            "position_bin": position_bin(step_index).astype(np.int8),
            "context_len": (100 + step_index).astype(np.int32),
            "tree_size": np.full(S, K, np.int16),
            "emitted_token": rng.integers(0, 32000, size=S).astype(np.int32),
            "accepted_len": accepted_len.astype(np.int16),
            "tau": (accepted_len + 1).astype(np.int16),
            "draft_time_s": np.full(S, 0.01),
            "verify_time_s": np.full(S, 0.02),
            "step_time_s": np.full(S, 0.03),
        },
        "steps",
    )
    prompts = _table(
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
    return nodes, steps_table, prompts


def write_synthetic_run(run_dir: str | Path, **kwargs) -> Path:
    """Write a complete synthetic run directory; keyword arguments go to synthetic_tables."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tables = synthetic_tables(**kwargs)
    rundir = RunDir(run_dir)
    for name, table in zip(TABLES, tables):
        rundir.write_table(name, table)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "run_id": kwargs.get("run_id", "synthetic"),
        "status": "complete",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": {
            "synthetic": True,
            "tree": "paper",
            "seed": kwargs.get("seed", 0),
            "prompts_per_domain": kwargs.get("prompts_per_domain", 50),
        },
        "counts": {name: t.num_rows for name, t in zip(TABLES, tables)},
    }
    rundir.write_manifest(manifest)
    return run_dir
