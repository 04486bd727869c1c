"""Measuring prompts: the measurement driver that ``specscope run`` and ``specscope sweep`` share,
and each prompt's node, step and prompt rows.

The driver (:func:`measure_rows`) commits one token per row: at every step every row's full tree
is drafted and the target scores it (:meth:`specscope.core.batch.Batch.score`: the rows of its
non-leaf nodes, a node's p coming from its parent's row), every node is recorded
(:func:`observe`), and each row commits the target's greedy token (:func:`commit_greedy_token`),
so that a prompt's trajectory is the target's plain greedy output. It runs B prompts at a time,
B = 1 included, refilling a finished prompt's row with the next. ``engine="naive"`` scores each
step with the recompute-everything oracle instead, one prompt at a time, and commits the same way.
Trees are static shapes with the draft's top tokens as children (dynamic trees and sampled
children are decoding's only). This module does not decide where records go: the caller's
``commit`` writes each prompt as it finishes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import torch

from ..core.batch import Batch, Row, StepScores
from ..core.loop import Step
from ..core.passes import position_limit
from ..drafters import lookup_for
from ..heap import release_free_memory
from ..models import ModelPair
from ..models.int8 import rowwise_attention_during
from ..prompts.items import PromptItem
from ..prompts.render import RenderedPrompt, eos_token_ids, render_item
from ..records import position_bin, to_table
from ..theory import CriteriaConfig
from ..trees import TreeShape, check_depth_fits
from .checks import MeasureConfig, MeasureError, check_batch_memory
from .naive import NaiveOracle
from .records import NodeRecords, certificate_records, step_record


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
    step_extras: list[dict[str, float]] = field(
        default_factory=list
    )  # per step: margin, KL, certificates
    steps: list[Step] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"


def start_prompts(
    pair: ModelPair, config: MeasureConfig, todo: list[tuple[int, PromptItem]]
) -> list[PromptState]:
    """Render ``todo`` ((order, item) pairs) and check that every prompt, its new tokens and a
    tree fit in the positions both models were built for, before any of them is measured."""
    limit = position_limit(*pair.models)
    check_depth_fits(config.tree.shape().max_depth, config.max_new_tokens, limit)
    states = []
    for order, item in todo:
        rendered = render_item(pair.tokenizer, item, config.rendering, config.max_prompt_tokens)
        states.append(PromptState(item, order, rendered, list(rendered.ids), time.perf_counter()))
    if not states:
        return states
    extra = config.max_new_tokens + config.tree.shape().max_depth
    longest = max(states, key=lambda s: len(s.context))
    if len(longest.context) + extra > limit:
        raise MeasureError(
            f"prompt {longest.item.id!r} is {len(longest.context)} tokens; with max_new_tokens "
            f"{config.max_new_tokens} and the tree's depth {extra - config.max_new_tokens} it needs "
            f"{len(longest.context) + extra} positions, but the models allow {limit}: lower "
            f"--max-prompt-tokens to {limit - extra} or fewer (prompts keep their last tokens) "
            "or --max-new-tokens"
        )
    return states


def observe(
    state: PromptState, scores: StepScores, shape: TreeShape, criteria: CriteriaConfig | None
) -> NodeRecords:
    """Record one step's nodes (and certificates) with the prompt."""
    record = step_record(scores, shape)
    record.nodes["step"] = np.full(scores.proposed, len(state.node_cols), dtype=np.int32)
    # the step row keeps its root context's margin and KL (node 0 is a root), certificates or not
    step_extras = {"target_margin": record.root_margin, "kl_target_draft": record.root_kl}
    if criteria is not None:
        node_certificates, certificates = certificate_records(scores, shape, criteria)
        record.nodes.update(node_certificates)
        step_extras.update(certificates)
    state.node_cols.append(record.nodes)
    state.step_extras.append(step_extras)
    return record


def commit_greedy_token(
    state: PromptState,
    scores: StepScores,
    shape: TreeShape,
    config: MeasureConfig,
    eos: set[int],
    step_time_s: float,
) -> bool:
    """Measurement's commit stage: observe a row's step and append the target's greedy token to
    its context; True when the prompt is finished (EOS or its token budget)."""
    record = observe(state, scores, shape, config.criteria)
    token = record.emitted_token
    state.steps.append(
        Step(
            len(state.steps),
            len(state.context),
            scores.proposed,
            record.accepted_len,
            record.accepted_len + 1,
            token,
            scores.draft_time_s,
            scores.verify_time_s,
            step_time_s,
        )
    )
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
        return {
            "run_id": [run_id] * n,
            "prompt_id": [item.id] * n,
            "domain": [item.domain] * n,
            "drafter": [pair.drafter.label] * n,
        }

    nodes = {k: np.concatenate([c[k] for c in state.node_cols]) for k in state.node_cols[0]}
    nodes["position_bin"] = position_bin(nodes["step"]).astype(np.int8)
    rows = [{**c, **vars(s)} for s, c in zip(state.steps, state.step_extras)]
    steps = {k: [r[k] for r in rows] for k in rows[0]}
    steps["position_bin"] = [position_bin(s) for s in steps["step"]]
    prompt = {
        "order": [state.order],
        "source": [item.source],
        "source_index": [item.source_index],
        "dataset": [item.dataset],
        "split": [item.split],
        "messages_json": [json.dumps(list(item.messages), ensure_ascii=False)],
        "prompt_text": [state.rendered.text],
        "prompt_tokens": [len(state.rendered.ids)],
        "truncated": [state.rendered.truncated],
        "generated_tokens": [len(state.output)],
        "output_token_ids": [state.output],
        "output_text": [pair.tokenizer.decode(state.output, skip_special_tokens=True)],
        "stop_reason": [state.stop_reason],
        "time_s": [time.perf_counter() - state.t_start],
    }
    return PromptRecords(
        nodes=to_table({**common(len(nodes["step"])), **nodes}, "nodes"),
        steps=to_table({**common(n_steps), **steps}, "steps"),
        prompt=to_table({**common(1), **prompt}, "prompts"),
    )


def measure_naive(
    pair: ModelPair,
    states: list[PromptState],
    config: MeasureConfig,
    shape: TreeShape,
    run_id: str,
    commit: Callable[[PromptState, PromptRecords], None],
) -> None:
    """The paper's algorithm, every row recomputed, one prompt at a time: the oracle."""
    naive = NaiveOracle(
        pair.draft and pair.draft.model,
        pair.target.model,
        pair.vocab_size,
        lookup_for(pair.drafter),
    )
    eos = eos_token_ids(pair)
    for state in states:
        state.t_start = time.perf_counter()
        done = False
        while not done:
            t0 = time.perf_counter()
            scores = naive.score(state.context, shape)
            done = commit_greedy_token(state, scores, shape, config, eos, 0.0)
            state.steps[-1] = replace(state.steps[-1], step_time_s=time.perf_counter() - t0)
        commit(state, finish_prompt(state, pair, run_id))


def measure_rows(
    pair: ModelPair,
    states: list[PromptState],
    config: MeasureConfig,
    shape: TreeShape,
    run_id: str,
    batch_size: int,
    commit: Callable[[PromptState, PromptRecords], None],
) -> None:
    """The measurement driver: ``states`` ``batch_size`` prompts at a time
    (:class:`~specscope.core.batch.Batch`), one greedy token committed per row and step; each
    prompt is committed as soon as it finishes and its row is refilled. Prompts of similar length
    run together (longest first, so the first batch is the largest), which wastes little padding."""
    eos = eos_token_ids(pair)
    pending = sorted(states, key=lambda s: -len(s.context))
    pending.reverse()  # pop() takes the longest first

    def join(count: int) -> list[Row]:  # the next prompts; their clocks start as they join
        joining = [pending.pop() for _ in range(min(count, len(pending)))]
        for s in joining:
            s.t_start = time.perf_counter()
        return [Row(s.context, s) for s in joining]

    batch = Batch(
        pair.draft and pair.draft.model,
        pair.target.model,
        pair.vocab_size,
        lookup_for(pair.drafter),
    )
    batch.refill([], join(batch_size))
    while batch.rows:
        t0 = time.perf_counter()
        scores = batch.score(shape)
        share = (time.perf_counter() - t0) / len(scores)
        finished = [
            i
            for i, (row, sc) in enumerate(zip(batch.rows, scores))
            if commit_greedy_token(row.payload, sc, shape, config, eos, share)
        ]
        for i in finished:
            state = batch.rows[i].payload
            commit(state, finish_prompt(state, pair, run_id))
        if finished:
            keep = [i for i in range(len(batch.rows)) if i not in finished]
            batch.refill(keep, join(len(finished)))
            release_free_memory()  # the finished prompts' buffers (specscope.heap)


def measure_prompts(
    pair: ModelPair,
    config: MeasureConfig,
    states: list[PromptState],
    run_id: str,
    commit: Callable[[int, PromptItem, PromptRecords], None],
    batch_size: int,
) -> None:
    """The prompt loop of ``run`` and ``sweep``: measure the prompts that :func:`start_prompts`
    checked, ``batch_size`` at a time (:func:`~specscope.measure.checks.default_batch_size`), and
    hand each prompt's records to ``commit`` as it finishes."""
    torch.manual_seed(config.seed)
    shape = config.tree.shape()

    def done(state: PromptState, records: PromptRecords) -> None:
        commit(state.order, state.item, records)

    # measurement records the draft's q too: with int8, make it batch-invariant like the target,
    # so that records do not depend on the batch size or the engine (decoding leaves the draft
    # on SDPA)
    with (
        rowwise_attention_during(pair.draft.model)
        if config.pair.quantize == "int8" and pair.draft is not None
        else nullcontext()
    ):
        if config.engine == "naive":
            measure_naive(pair, states, config, shape, run_id, done)
            return
        check_batch_memory(
            pair,
            min(batch_size, len(states)),
            config.max_prompt_tokens + config.max_new_tokens,
            len(shape),
        )
        measure_rows(pair, states, config, shape, run_id, batch_size, done)
