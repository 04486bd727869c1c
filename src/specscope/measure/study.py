"""Measuring prompts: the paper protocol as an acceptor of the speculation loop, the prompt loop
that ``specscope run`` and ``specscope sweep`` share, and each prompt's node, step and prompt rows.

At every step the loop drafts the full tree, the target scores it (the rows of its non-leaf
nodes: a node's p comes from its parent's row), :class:`PaperProtocol` records every node, and the
loop commits only the target's greedy token, so the trajectory is the target's plain greedy
output. B prompts at a time go through :class:`~specscope.measure.batched.BatchedEngine` instead,
and ``engine="naive"`` through the recompute-everything oracle; all three feed the same
:func:`~specscope.measure.records.step_record`. This module does not decide where records go: the
caller's ``commit`` writes each prompt as it finishes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from ..core.draft import ChildRule, DraftTree
from ..core.loop import Accepted, DecodeConfig, Session, Speculator, Step
from ..core.passes import position_limit
from ..models import ModelPair
from ..models.int8 import use_rowwise_attention
from ..prompts.items import PromptItem
from ..prompts.render import RenderedPrompt, eos_token_ids, render_item
from ..records import position_bin, to_table
from ..theory import CriteriaConfig
from ..trees import TreeShape
from .naive import NaiveEngine
from .records import (NodeRecords, StepScores, certificate_records,
                      step_record, tree_scores)

if TYPE_CHECKING:
    from ..run.config import RunConfig  # run.config imports this module's ENGINES


@dataclass
class PromptRecords:
    nodes: pa.Table
    steps: pa.Table
    prompt: pa.Table


@dataclass
class PromptState:
    """One prompt being measured: its context grows by the target's greedy token each step."""

    item: PromptItem
    order: int
    rendered: RenderedPrompt
    context: list[int]
    t_start: float
    node_cols: list[dict[str, np.ndarray]] = field(default_factory=list)
    step_extras: list[dict[str, float]] = field(default_factory=list)  # per step: margin, KL, certificates
    steps: list[Step] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"


def start_prompts(pair: ModelPair, config: RunConfig,
                  todo: list[tuple[int, PromptItem]]) -> list[PromptState]:
    """Render ``todo`` ((order, item) pairs) and check that every prompt, its new tokens and a
    tree fit in the positions both models were built for, before any of them is measured."""
    from ..run.config import RunConfigError  # run.config imports this module's ENGINES

    states = []
    for order, item in todo:
        rendered = render_item(pair.tokenizer, item, config.rendering, config.max_prompt_tokens)
        states.append(PromptState(item, order, rendered, list(rendered.ids), time.perf_counter()))
    if not states:
        return states
    limit = position_limit(pair.draft.model, pair.target.model)
    extra = config.max_new_tokens + config.tree.shape().max_depth
    longest = max(states, key=lambda s: len(s.context))
    if len(longest.context) + extra > limit:
        raise RunConfigError(
            f"prompt {longest.item.id!r} is {len(longest.context)} tokens; with max_new_tokens "
            f"{config.max_new_tokens} and the tree's depth {extra - config.max_new_tokens} it needs "
            f"{len(longest.context) + extra} positions, but the models allow {limit}: lower "
            f"--max-prompt-tokens to {limit - extra} or fewer (prompts keep their last tokens) "
            "or --max-new-tokens")
    return states


def observe(state: PromptState, scores: StepScores, shape: TreeShape,
            criteria: CriteriaConfig | None) -> NodeRecords:
    """Record one step's nodes (and certificates) with the prompt."""
    record = step_record(scores, shape)
    record.nodes["step"] = np.full(len(shape), len(state.node_cols), dtype=np.int32)
    # the step row keeps its root context's margin and KL (node 0 is a root), certificates or not
    step_extras = {"target_margin": float(record.nodes["target_margin"][0]),
                   "kl_target_draft": float(record.nodes["kl_target_draft"][0])}
    if criteria is not None:
        node_certificates, certificates = certificate_records(scores, shape, criteria)
        record.nodes.update(node_certificates)
        step_extras.update(certificates)
    state.node_cols.append(record.nodes)
    state.step_extras.append(step_extras)
    return record


@dataclass
class PaperProtocol:
    """The accept stage of measurement: record every node; commit the target's greedy token."""

    state: PromptState
    shape: TreeShape
    criteria: CriteriaConfig | None
    rule: ChildRule
    first_token_from_prefill: bool = False
    cut_tree_at_budget: bool = False  # the same tree at every step
    verify_leaves: bool = False  # a node's p is its parent's row: leaves' rows are never read

    def accept(self, s: Session, tree: DraftTree, logits: torch.Tensor,
               draft_time_s: float, verify_time_s: float) -> Accepted:
        scores = tree_scores(tree, logits, tree.non_leaves, self.rule.vocab, draft_time_s,
                             verify_time_s)
        record = observe(self.state, scores, self.shape, self.criteria)
        return Accepted([], record.emitted_token, record.accepted_len)


def commit_greedy_token(state: PromptState, scores: StepScores, shape: TreeShape,
                        config: RunConfig, eos: set[int], step_time_s: float) -> bool:
    """Observe a step scored outside the loop (batched, naive) and commit the target's greedy
    token as the loop would; True when the prompt is finished."""
    record = observe(state, scores, shape, config.criteria)
    token = record.emitted_token
    state.steps.append(Step(len(state.steps), len(state.context), len(shape), record.accepted_len,
                            record.accepted_len + 1, token, scores.draft_time_s,
                            scores.verify_time_s, step_time_s))
    state.context.append(token)
    state.output.append(token)
    if token in eos:
        state.stop_reason = "eos"
        return True
    return len(state.output) >= config.max_new_tokens


def finish_prompt(state: PromptState, pair: ModelPair, run_id: str) -> PromptRecords:
    """The node, step and prompt rows of a finished prompt."""
    item, n_steps = state.item, len(state.steps)

    def common(n: int) -> dict:
        return {"run_id": [run_id] * n, "prompt_id": [item.id] * n, "domain": [item.domain] * n}

    nodes = {k: np.concatenate([c[k] for c in state.node_cols]) for k in state.node_cols[0]}
    nodes["position_bin"] = position_bin(nodes["step"]).astype(np.int8)
    rows = [{**c, **vars(s)} for s, c in zip(state.steps, state.step_extras)]
    steps = {k: [r[k] for r in rows] for k in rows[0]}
    steps["position_bin"] = [position_bin(s) for s in steps["step"]]
    prompt = {
        "order": [state.order], "source": [item.source], "source_index": [item.source_index],
        "dataset": [item.dataset], "split": [item.split],
        "messages_json": [json.dumps(list(item.messages), ensure_ascii=False)],
        "prompt_text": [state.rendered.text], "prompt_tokens": [len(state.rendered.ids)],
        "truncated": [state.rendered.truncated], "generated_tokens": [len(state.output)],
        "output_token_ids": [state.output],
        "output_text": [pair.tokenizer.decode(state.output, skip_special_tokens=True)],
        "stop_reason": [state.stop_reason], "time_s": [time.perf_counter() - state.t_start],
    }
    return PromptRecords(
        nodes=to_table({**common(len(nodes["step"])), **nodes}, "nodes"),
        steps=to_table({**common(n_steps), **steps}, "steps"),
        prompt=to_table({**common(1), **prompt}, "prompts"),
    )


def _measure_in_loop(pair: ModelPair, state: PromptState, config: RunConfig,
                     shape: TreeShape) -> None:
    """The speculation loop with the paper protocol as its accept stage."""
    loop = Speculator(pair.draft.model, pair.target.model, pair.vocab_size,
                      frozenset(eos_token_ids(pair)))
    protocol = PaperProtocol(state, shape, config.criteria, ChildRule(pair.vocab_size, keep_q=True))
    result = loop.run(state.context, shape, DecodeConfig(max_new_tokens=config.max_new_tokens),
                      protocol)
    state.steps, state.output, state.stop_reason = result.steps, result.tokens, result.stop_reason


def _measure_naive(pair: ModelPair, state: PromptState, config: RunConfig,
                   shape: TreeShape) -> None:
    """The paper's algorithm, every row recomputed: the oracle."""
    naive = NaiveEngine(pair.draft.model, pair.target.model, pair.vocab_size)
    eos = eos_token_ids(pair)
    done = False
    while not done:
        t0 = time.perf_counter()
        scores = naive.score(state.context, shape)
        done = commit_greedy_token(state, scores, shape, config, eos, 0.0)
        state.steps[-1] = replace(state.steps[-1], step_time_s=time.perf_counter() - t0)


# --engine: how one prompt is measured
ENGINES = {"cached": _measure_in_loop, "naive": _measure_naive}


def measure_prompt(pair: ModelPair, state: PromptState, config: RunConfig, shape: TreeShape,
                   run_id: str, engine: str = "cached") -> PromptRecords:
    """Run the paper protocol on one started prompt and return its node, step and prompt rows."""
    state.t_start = time.perf_counter()
    ENGINES[engine](pair, state, config, shape)
    return finish_prompt(state, pair, run_id)


def measure_batched(pair: ModelPair, states: list[PromptState], config: RunConfig,
                    shape: TreeShape, run_id: str, batch_size: int,
                    commit: Callable[[PromptState, PromptRecords], None]) -> None:
    """Measure ``states`` ``batch_size`` prompts at a time (:mod:`specscope.measure.batched`); each
    prompt is committed as soon as it finishes and its row is refilled. Prompts of similar length
    run together (longest first, so the first batch is the largest), which wastes little padding."""
    from .batched import BatchedEngine, Row

    eos = eos_token_ids(pair)
    pending = sorted(states, key=lambda s: -len(s.context))
    pending.reverse()  # pop() takes the longest first

    def join(count: int) -> list[Row]:  # the next prompts; their clocks start as they join
        joining = [pending.pop() for _ in range(min(count, len(pending)))]
        for s in joining:
            s.t_start = time.perf_counter()
        return [Row(s.context, s) for s in joining]

    engine = BatchedEngine(pair.draft.model, pair.target.model, pair.vocab_size)
    engine.replace_rows([], join(batch_size))
    while engine.rows:
        t0 = time.perf_counter()
        scores = engine.score(shape)
        share = (time.perf_counter() - t0) / len(scores)
        finished = [i for i, (row, sc) in enumerate(zip(engine.rows, scores))
                    if commit_greedy_token(row.payload, sc, shape, config, eos, share)]
        for i in finished:
            state = engine.rows[i].payload
            commit(state, finish_prompt(state, pair, run_id))
        if finished:
            keep = [i for i in range(len(engine.rows)) if i not in finished]
            engine.replace_rows(keep, join(len(finished)))


def measure_prompts(pair: ModelPair, config: RunConfig, states: list[PromptState],
                    run_id: str, commit: Callable[[int, PromptItem, PromptRecords], None],
                    batch_size: int = 1) -> None:
    """The prompt loop of ``run`` and ``sweep``: measure the prompts that :func:`start_prompts`
    checked and hand each prompt's records to ``commit`` as it finishes."""
    if config.pair.quantize == "int8":
        # measurement records the draft's q too: make it batch-invariant like the target, so
        # that records do not depend on the batch size (decoding leaves the draft on SDPA)
        use_rowwise_attention(pair.draft.model)
    torch.manual_seed(config.seed)
    shape = config.tree.shape()
    if batch_size > 1:
        measure_batched(pair, states, config, shape, run_id, batch_size,
                        lambda state, records: commit(state.order, state.item, records))
        return
    for state in states:
        commit(state.order, state.item, measure_prompt(pair, state, config, shape, run_id,
                                                       config.engine))
