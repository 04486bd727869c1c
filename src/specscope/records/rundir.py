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
a hidden temporary name of its own (two writers never share one) and renamed into place; object
stores have no atomic rename but show each object whole or not at all, so there files are written
in place, and the prompt shard, written last, is still the commit marker (write, then marker).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..files import temporary_name
from .checks import check_records
from .schema import SCHEMA_VERSION, SCHEMAS, TABLES, Run, RunDirError


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
    target = temporary_name(path) if renames_atomically(fs) else path
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
                table = self._committed(name)
        except (pa.ArrowInvalid, OSError) as e:
            raise RunDirError(f"{self.root}: cannot read {name} records: {e}") from e
        missing = [c for c in SCHEMAS[name].names if c not in table.column_names]
        if missing:
            raise RunDirError(f"{self.root}: {name} records lack columns {missing}")
        return table.to_pandas()

    def _committed(self, name: str) -> pa.Table:
        """One table's parts of the committed prompts (those whose prompt part exists), joined."""
        done = {f.rpartition("/")[2] for f in self._files(f"{self.parts}/prompts")}
        files = [f for f in self._files(f"{self.parts}/{name}") if f.rpartition("/")[2] in done]
        if not files:
            return SCHEMAS[name].empty_table()
        return pa.concat_tables([pq.read_table(f, filesystem=self.fs) for f in files],
                                promote_options="default")

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
        for name in TABLES:
            table = self._committed(name)
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
    rundir = RunDir(run_dir)
    run = Run(run_dir, manifest, *(rundir.read_table(name) for name in TABLES))
    check_records(run)
    return run


