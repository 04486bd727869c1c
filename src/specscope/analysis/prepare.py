"""Read a run's records for analysis: check them, and derive what the tables need.

Analysis reads the Parquet records only (through :func:`specscope.records.load_run`), so it works on
runs made anywhere. Beside the recorded columns it derives, per node:

- ``path_accepted``: the node and every ancestor are greedy-accepted (the step's verifier would
  emit this node's token);
- ``eligible``: the node's parent path is accepted (roots always are); the *conditional* greedy
  acceptance rate, ``P(greedy_accept | eligible)``, is the per-edge probability that a
  Sequoia-style tree optimiser multiplies along paths. The *unconditional* rate averages over
  every node, including nodes whose context already left the target's greedy path;
- ``on_chain``: the node lies on the top-1 chain (every node on its path has sibling rank 0), the
  tree a classic chain speculator would draft;

and per step, from the nodes: the accepted length implied by them (checked against
``steps.accepted_len``) and the accepted length of the top-1 chain alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from ..records import Run, RunDirError, load_run, tree_paths

ALL = "All"  # the pooled row of the analysis tables, labelled as in the paper's tables


@dataclass(frozen=True)
class NodeArrays:
    """Node columns as numpy arrays (one entry per node); codes index Records' tuples."""

    prompt: np.ndarray  # int64 index into Records.prompt_ids
    domain: np.ndarray  # int64 index into Records.domains
    step: np.ndarray
    depth: np.ndarray  # 1..D
    rank: np.ndarray  # sibling rank
    position_bin: np.ndarray
    alpha: np.ndarray
    greedy: np.ndarray  # greedy_accept as 0.0 / 1.0
    entropy: np.ndarray  # target entropy, nats
    eligible: np.ndarray  # bool: parent path accepted (roots: True)
    path_accepted: np.ndarray  # bool: node and all ancestors accepted
    on_chain: np.ndarray  # bool: on the sibling-rank-0 path

    def __len__(self) -> int:
        return len(self.prompt)


@dataclass(frozen=True)
class StepArrays:
    """Step columns as numpy arrays (one entry per step record)."""

    prompt: np.ndarray
    domain: np.ndarray
    step: np.ndarray
    tau: np.ndarray
    accepted_len: np.ndarray
    chain_len: np.ndarray  # float; accepted length of the top-1 chain alone, NaN without nodes

    def __len__(self) -> int:
        return len(self.prompt)


@dataclass(frozen=True)
class Records:
    """A run's records, checked and indexed for vectorised analysis."""

    run: Run
    domains: tuple[str, ...]  # sorted; every domain seen in any of the three tables
    prompt_ids: tuple[str, ...]  # sorted; the prompts that have node or step records
    prompt_domain: np.ndarray  # (P,) domain index of each prompt
    nodes: NodeArrays
    steps: StepArrays
    max_depth: int
    n_ranks: int
    n_bins: int
    warnings: tuple[str, ...]

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_ids)


def read_run(path: str | Path) -> Run:
    """Load a run directory for analysis, turning every unreadable case into a RunDirError."""
    path = Path(path)
    if not path.exists():
        raise RunDirError(f"{path} does not exist")
    try:
        run = load_run(path)
    except RunDirError:
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:
        raise RunDirError(f"{path}: cannot read the run's records: {e}") from e
    if run.manifest.get("status") == "complete":
        missing = [
            f"{n}.parquet"
            for n in ("nodes", "steps", "prompts")
            if not (path / f"{n}.parquet").is_file()
        ]
        if missing:
            raise RunDirError(
                f"{path}: the manifest says the run is complete, "
                f"but {', '.join(missing)} is missing"
            )
    return run


def _column(df: pd.DataFrame, name: str, table: str, dtype: type) -> np.ndarray:
    col = df[name]
    if col.isna().any():
        raise RunDirError(
            f"{table} records: column {name!r} has {int(col.isna().sum())} missing values"
        )
    try:
        return col.to_numpy(dtype=dtype)
    except (TypeError, ValueError) as e:
        raise RunDirError(f"{table} records: column {name!r} is not {dtype.__name__}: {e}") from e


def _factor(df: pd.DataFrame, name: str, table: str) -> tuple[np.ndarray, list[str]]:
    """Integer codes of a string column and its distinct values (fast on Arrow strings)."""
    codes, uniques = pd.factorize(df[name])
    if (codes < 0).any():
        raise RunDirError(
            f"{table} records: column {name!r} has {int((codes < 0).sum())} missing values"
        )
    return codes.astype(np.int64), [str(u) for u in uniques]


def _recode(codes: np.ndarray, uniques: list[str], keys: tuple[str, ...]) -> np.ndarray:
    return pd.Index(keys).get_indexer(uniques).astype(np.int64)[codes] if len(codes) else codes


def prepare(run: Run) -> Records:
    """Check a run's records and derive the per-node and per-step fields analysis needs."""
    warnings: list[str] = []
    if run.manifest.get("status") != "complete":
        warnings.append(
            f"the run's status is {run.manifest.get('status')!r}, not 'complete': "
            f"these are the prompts committed so far"
        )
    nodes_df, steps_df, prompts_df = run.nodes, run.steps, run.prompts
    if len(nodes_df) == 0:
        raise RunDirError(
            f"{run.path}: the run has no node records (nodes.parquet empty or missing)"
        )

    node_p, node_p_names = _factor(nodes_df, "prompt_id", "nodes")
    node_d, node_d_names = _factor(nodes_df, "domain", "nodes")
    step_p, step_p_names = _factor(steps_df, "prompt_id", "steps")
    step_d, step_d_names = _factor(steps_df, "domain", "steps")
    domains = tuple(
        sorted(
            set(node_d_names) | set(step_d_names) | set(prompts_df["domain"].dropna().astype(str))
        )
    )
    prompt_ids = tuple(sorted(set(node_p_names) | set(step_p_names)))
    prompt = _recode(node_p, node_p_names, prompt_ids)
    domain = _recode(node_d, node_d_names, domains)
    s_prompt = _recode(step_p, step_p_names, prompt_ids)
    s_domain = _recode(step_d, step_d_names, domains)

    # Each prompt belongs to one domain: the bootstrap resamples prompts within domains.
    G = len(domains)
    pairs = np.unique(np.concatenate([prompt * G + domain, s_prompt * G + s_domain]))
    owners = pairs // G
    if len(np.unique(owners)) != len(owners):
        bad = owners[np.flatnonzero(owners[1:] == owners[:-1])[0]]
        raise RunDirError(f"prompt {prompt_ids[bad]!r} appears under more than one domain")
    prompt_domain = np.empty(len(prompt_ids), np.int64)
    prompt_domain[owners] = pairs % G

    step = _column(nodes_df, "step", "nodes", np.int64)
    depth = _column(nodes_df, "depth", "nodes", np.int64)
    rank = _column(nodes_df, "sibling_rank", "nodes", np.int64)
    pos_bin = _column(nodes_df, "position_bin", "nodes", np.int64)
    node_id = _column(nodes_df, "node_id", "nodes", np.int64)
    parent_id = _column(nodes_df, "parent_id", "nodes", np.int64)
    alpha = _column(nodes_df, "alpha", "nodes", np.float64)
    greedy = _column(nodes_df, "greedy_accept", "nodes", bool)
    entropy = _column(nodes_df, "target_entropy", "nodes", np.float64)

    if depth.min() < 1:
        raise RunDirError(
            f"nodes records: depth must be >= 1 (roots have depth 1), found {depth.min()}"
        )
    if rank.min() < 0 or pos_bin.min() < 0 or step.min() < 0 or node_id.min() < 0:
        raise RunDirError("nodes records: negative step, node_id, sibling_rank or position_bin")
    bad_alpha = ~np.isfinite(alpha) | (alpha < 0) | (alpha > 1 + 1e-9)
    if bad_alpha.any():
        raise RunDirError(
            f"nodes records: {int(bad_alpha.sum())} nodes have an alpha that is not "
            f"a number in [0, 1] (corrupt records?)"
        )
    if (~np.isfinite(entropy) | (entropy < -1e-9)).any():
        raise RunDirError("nodes records: target_entropy must be a finite number >= 0")

    # Tree structure: find each node's parent row within its (prompt, step) tree.
    n_node_ids = int(max(node_id.max(), parent_id.max())) + 1
    tree = prompt * (int(step.max()) + 1) + step
    key = tree * n_node_ids + node_id
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    if (sorted_key[1:] == sorted_key[:-1]).any():
        raise RunDirError("nodes records: the same (prompt_id, step, node_id) appears twice")
    is_root = parent_id < 0
    pos = np.searchsorted(sorted_key, tree * n_node_ids + parent_id)
    found = ~is_root & (pos < len(key))
    found[found] = sorted_key[pos[found]] == (tree * n_node_ids + parent_id)[found]
    parent_row = np.where(found, order[np.minimum(pos, len(key) - 1)], -1)
    orphans = int((~is_root & ~found).sum())
    if orphans:
        warnings.append(
            f"{orphans} nodes name a parent that is not in their tree; they count as "
            f"not eligible for conditional rates"
        )
    if ((depth == 1) != is_root).any():
        warnings.append("some nodes have depth 1 with a parent, or a parent at depth 1")

    max_depth = int(depth.max())
    paths = tree_paths(greedy, depth, rank, is_root, parent_row)
    eligible, path_accepted, on_chain = paths.eligible, paths.accepted, paths.top1

    node_arrays = NodeArrays(
        prompt,
        domain,
        step,
        depth,
        rank,
        pos_bin,
        alpha,
        greedy.astype(np.float64),
        entropy,
        eligible,
        path_accepted,
        on_chain,
    )

    # Per step, from the nodes: the tree's and the top-1 chain's accepted lengths.
    s_step = _column(steps_df, "step", "steps", np.int64)
    tau = _column(steps_df, "tau", "steps", np.int64)
    accepted = _column(steps_df, "accepted_len", "steps", np.int64)
    per_tree = pd.DataFrame(
        {
            "tree": tree,
            "len": np.where(path_accepted, depth, 0),
            "chain": (path_accepted & on_chain).astype(np.int64),
        }
    )
    per_tree = per_tree.groupby("tree").agg(len=("len", "max"), chain=("chain", "sum"))
    s_tree = s_prompt * (int(step.max()) + 1) + s_step
    s_tree = np.where((s_step <= step.max()), s_tree, -1)
    at = per_tree.index.get_indexer(s_tree)
    has_nodes = at >= 0
    chain_len = np.where(has_nodes, per_tree["chain"].to_numpy()[np.maximum(at, 0)], np.nan)
    implied = per_tree["len"].to_numpy()[np.maximum(at, 0)]
    if len(tau) and (tau != accepted + 1).any():
        warnings.append(f"{int((tau != accepted + 1).sum())} steps have tau != accepted_len + 1")
    mismatched = int((has_nodes & (implied != accepted)).sum())
    if mismatched:
        warnings.append(
            f"{mismatched} steps record an accepted_len that differs from the one their nodes imply"
        )
    if len(tau) == 0:
        warnings.append("the run has no step records: tau is undefined")
    if len(tau) and tau.min() < 1:
        warnings.append("some steps have tau < 1 (every verification emits at least one token)")
    step_arrays = StepArrays(s_prompt, s_domain, s_step, tau, accepted, chain_len)

    empty = [d for d in domains if not (domain == domains.index(d)).any()]
    if empty:
        warnings.append(f"no node records for domain(s) {', '.join(empty)}: their cells are empty")
    return Records(
        run,
        domains,
        prompt_ids,
        prompt_domain,
        node_arrays,
        step_arrays,
        max_depth,
        int(rank.max()) + 1,
        int(pos_bin.max()) + 1,
        tuple(warnings),
    )
