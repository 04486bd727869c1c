"""Run directories and their Parquet records (docs/reference/records.md).

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
consolidated files when they are current and the shards otherwise, and refuses records whose run
id is not the manifest's. A part's file name is the prompt's order and its id, hashed where the id
is long or not a safe file name (:func:`part_name`).

:class:`RunDir` writes through a pyarrow filesystem, so a run directory can also be any URI that
``pyarrow.fs.FileSystem.from_uri`` accepts (``s3://bucket/runs/a``, ``gs://...``, ``file:///...``)
and workers on other machines can commit prompts to it. On a local disk every file is written under
a hidden temporary name of its own (two writers never share one) and renamed into place; object
stores have no atomic rename but show each object whole or not at all, so there files are written
in place, and the prompt shard, written last, is still the commit marker (write, then marker).

One writer per run: :func:`run_lock` holds an exclusive lock (``flock`` on ``.specscope.lock`` in
the run directory) for a run's life, so a second ``run`` on a live run directory is refused naming
the process that holds it, and a run left ``running`` is taken for a failed start only when no
process holds its lock. A sweep's shards hold the run's lock shared (the shards of one run measure
side by side) and their own shard's lock exclusively (one attempt of a shard at a time). Object
stores offer no lock: on a URI the caller is the only guard against two writers.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..files import os_error_reason, parse_json_object, temporary_name
from .checks import check_records
from .schema import FILLED_COLUMNS, SCHEMA_VERSION, SCHEMAS, TABLES, Run, RunDirError

# the kinds of column type a cast may move between without changing what a value means: an
# integer of another width (overflow refused), a float from an integer, a string of another offset
# width; a string where a boolean or a number belongs is not one (a CSV round trip's "false")
_KINDS = (
    ("boolean", pa.types.is_boolean),
    ("integer", pa.types.is_integer),
    ("number", lambda t: pa.types.is_floating(t) or pa.types.is_integer(t)),
    ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
    ("list", lambda t: pa.types.is_list(t) or pa.types.is_large_list(t)),
)


def _same_kind(declared: pa.DataType, found: pa.DataType) -> bool:
    if pa.types.is_null(found):  # a column of nulls only
        return True
    if pa.types.is_dictionary(found):
        found = found.value_type
    kind = next(test for _, test in _KINDS if test(declared))
    return kind(found) and not (pa.types.is_integer(declared) and pa.types.is_floating(found))


def typed_records(table: pa.Table, name: str, where: str) -> pa.Table:
    """``table`` (records of the named schema read from ``where``) with every column of the
    schema cast to its declared type, columns added since version 1 filled in, other columns
    kept; a missing column, or one of another kind or whose values do not fit (a string of
    "true"/"false" where a boolean belongs, an integer too large for its width) is refused with
    the file and the column named. The one check of records on read."""
    schema = SCHEMAS[name]
    for column, value in FILLED_COLUMNS.items():
        if column in schema.names and column not in table.column_names:
            table = table.append_column(column, pa.array([value] * table.num_rows, pa.string()))
    missing = [c for c in schema.names if c not in table.column_names]
    if missing:
        raise RunDirError(f"{where}: {name} records lack columns {missing}")
    for declared in schema:
        index = table.schema.get_field_index(declared.name)
        found = table.schema.field(index).type
        if found == declared.type:
            continue
        problem = f"holds {found}, the {name} records' schema says {declared.type}"
        if _same_kind(declared.type, found):
            try:
                column = table.column(index).cast(declared.type, safe=True)
                table = table.set_column(index, declared, column)
                continue
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                problem = f"does not fit {declared.type} ({e})"
        raise RunDirError(
            f"{where}: column {declared.name!r} {problem}; records rewritten by another tool "
            "(a CSV round trip, pandas object columns) must keep the schema's types "
            "(docs/reference/records.md)"
        )
    return table


def open_location(
    location: str | Path, filesystem: pafs.FileSystem | None = None
) -> tuple[pafs.FileSystem, str]:
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
    written in place on object stores, where an object appears whole or not at all. A write that
    fails (a full disk, a read-only directory) leaves no temporary behind and raises RunDirError
    naming the file; what was committed before stays.
    """
    parent, _, name = path.rpartition("/")
    target = temporary_name(path) if renames_atomically(fs) else path
    try:
        fs.create_dir(parent, recursive=True)
        if isinstance(data, pa.Table):
            pq.write_table(data, target, filesystem=fs)
        else:
            with fs.open_output_stream(target) as f:
                f.write(data)
        if target != path:
            fs.move(target, path)
    except OSError as e:  # pyarrow's I/O errors are OSErrors too
        if target != path:
            try:
                fs.delete_file(target)
            except OSError:
                pass  # never created
        kept = "; committed prompts are kept and the same command resumes"
        raise RunDirError(f"cannot write {path}: {os_error_reason(e)}{kept}") from None


def json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode()


def read_json(fs: pafs.FileSystem, path: str) -> dict | None:
    """A JSON object file through ``fs``, or None where there is none; RunDirError naming it
    where it is unreadable, not UTF-8, not JSON, nested too deep or not an object."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    try:
        with fs.open_input_stream(path) as f:
            raw = f.read()
    except OSError as e:
        raise RunDirError(f"cannot read {path}: {e.strerror or e}") from None
    return parse_json_object(raw, RunDirError, path)


# Prompt ids that are not file names (too long, or holding other characters than these) are
# hashed into their part's name.
PART_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
PART_NAME_MAX = 64


def safe_name(text: str) -> str:
    """``text`` where it is a short safe file name, else a readable prefix of it and a sha256 of
    the whole (any text gives a valid name, and different texts different names)."""
    if len(text) <= PART_NAME_MAX and set(text) <= PART_NAME_CHARS:
        return text
    prefix = "".join(c if c in PART_NAME_CHARS else "_" for c in text[:32])
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{prefix}-{digest}"


def part_name(order: int, prompt_id: str) -> str:
    """The file name of a prompt's part: its order, then the id as a :func:`safe_name`."""
    return f"{order:06d}-{safe_name(prompt_id)}.parquet"


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
        return f"{self.parts}/{table}/{part_name(order, prompt_id)}"

    def _files(self, folder: str) -> list[str]:
        """The committed-looking Parquet files of a folder (no hidden temporaries), sorted."""
        infos = self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        return sorted(
            i.path
            for i in infos
            if i.type == pafs.FileType.File
            and i.base_name.endswith(".parquet")
            and not i.base_name.startswith(".")
        )

    def _write(self, table: pa.Table, path: str) -> None:
        write_file(self.fs, path, table)

    def write_table(self, name: str, table: pa.Table) -> None:
        """Write a consolidated table (``nodes``, ``steps`` or ``prompts``)."""
        self._write(table, f"{self.root}/{name}.parquet")

    def consolidated_is_current(self) -> bool:
        """Whether the consolidated files hold the run's records: all three exist, and there are
        no committed parts (a synthetic run) or the run is complete and its consolidated prompts
        are as many as its committed prompts. A run that grew after it was consolidated (prompts
        appended, resumed, interrupted) is read from its parts."""
        files = [f"{self.root}/{name}.parquet" for name in TABLES]
        if any(info.type != pafs.FileType.File for info in self.fs.get_file_info(files)):
            return False
        prompts = f"{self.root}/prompts.parquet"
        committed = len(self._files(f"{self.parts}/prompts"))
        if committed == 0:
            return True
        if (self.read_manifest() or {}).get("status") != "complete":
            return False
        try:
            rows = pq.ParquetFile(prompts, filesystem=self.fs).metadata.num_rows
        except (pa.ArrowException, OSError):
            return False  # damaged: the parts hold the records
        return rows == committed

    def read_table(self, name: str, consolidated: bool | None = None) -> pd.DataFrame:
        """A table's records, each column of the schema cast to its declared type
        (:func:`typed_records`): the consolidated file where it is current (``consolidated``;
        default :meth:`consolidated_is_current`), else the committed parts (a run that is still
        going, was interrupted, or grew since it was consolidated)."""
        if consolidated is None:
            consolidated = self.consolidated_is_current()
        try:
            if consolidated:
                table = self._typed(f"{self.root}/{name}.parquet", name)
            else:
                table = self._committed(name)
        except (pa.ArrowInvalid, OSError) as e:
            raise RunDirError(f"{self.root}: cannot read {name} records: {e}") from e
        return table.to_pandas()

    def _typed(self, path: str, name: str) -> pa.Table:
        return typed_records(pq.read_table(path, filesystem=self.fs), name, path)

    def _committed(self, name: str) -> pa.Table:
        """One table's parts of the committed prompts (those whose prompt part exists), joined."""
        done = {f.rpartition("/")[2] for f in self._files(f"{self.parts}/prompts")}
        files = [f for f in self._files(f"{self.parts}/{name}") if f.rpartition("/")[2] in done]
        if not files:
            return SCHEMAS[name].empty_table()
        return pa.concat_tables([self._typed(f, name) for f in files], promote_options="default")

    def done_prompt_ids(self) -> set[str]:
        return {
            pq.read_table(f, columns=["prompt_id"], filesystem=self.fs).column(0)[0].as_py()
            for f in self._files(f"{self.parts}/prompts")
        }

    def commit_prompt(
        self, order: int, prompt_id: str, nodes: pa.Table, steps: pa.Table, prompt: pa.Table
    ) -> None:
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
    if fs.get_file_info(root).type == pafs.FileType.Directory and not fs.get_file_info(
        pafs.FileSelector(root)
    ):
        fs.delete_dir(root)


LOCK_FILE = ".specscope.lock"


def is_lock_file(name: str) -> bool:
    """Whether ``name`` is one of the lock files :func:`run_lock` keeps in a run directory."""
    return name.startswith(".specscope.") and name.endswith(".lock")


def _take_lock(path: Path, shared: bool, what: str) -> int:
    """An open descriptor of ``path`` holding its flock (shared or exclusive), or RunDirError
    naming the process that holds it. The file a descriptor locks is checked to still be the one
    at ``path`` (a releasing holder unlinks it), so two holders never lock different files."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as e:
            if path.is_symlink():
                raise RunDirError(
                    f"{path} is a symbolic link; remove it (specscope's lock file is a plain file)"
                ) from None
            raise RunDirError(f"cannot lock {what}: {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            try:
                holder = json.loads(owner)
                holder = f"pid {holder['pid']} on {holder['host']}, since {holder['started']}"
            except (ValueError, TypeError, KeyError):
                holder = "a sweep's shards, or a process starting"
            raise RunDirError(
                f"{what} is being written by another specscope process ({holder}); "
                "wait for it to finish, or write elsewhere"
            ) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder released and unlinked it between our open and our lock
    try:
        os.ftruncate(fd, 0)  # what a killed holder left names nobody
        if not shared:
            started = datetime.now(UTC).isoformat(timespec="seconds")
            os.pwrite(
                fd,
                json.dumps(
                    {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
                ).encode(),
                0,
            )
    except OSError as e:  # a full disk
        _release_lock(fd, path, shared)
        raise RunDirError(f"cannot lock {what}: {path}: {e.strerror or e}") from None
    return fd


def _release_lock(fd: int, path: Path, shared: bool) -> None:
    """Unlink the lock file (if no one else holds it) and release the lock."""
    try:
        if shared:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the last holder removes the file
        os.unlink(path)
    except OSError:
        pass  # another holder remains, or the file is gone: it stays theirs
    finally:
        os.close(fd)


@contextmanager
def run_lock(
    location: str | Path, filesystem: pafs.FileSystem | None = None, shard: str | None = None
) -> Iterator[None]:
    """Hold the run directory's lock while the block runs: exclusively for a run, or, with
    ``shard`` (a sweep shard's id), the run's lock shared and the shard's own lock exclusively.

    The directory is created where it does not exist, and removed again on the way out if it is
    then empty (a run that failed before writing anything). On a URI (an object store) there is
    no lock and the block runs unguarded.
    """
    fs, root = open_location(location, filesystem)
    if not renames_atomically(fs):
        yield
        return
    root_path = Path(root)
    created = [p for p in (root_path, *root_path.parents) if not p.exists()]
    root_path.mkdir(parents=True, exist_ok=True)
    held: list[tuple[int, Path, bool]] = []
    try:
        locks = [(root_path / LOCK_FILE, shard is not None, f"run directory {root}")]
        if shard is not None:
            locks.append(
                (
                    root_path / f".specscope.shard-{safe_name(shard)}.lock",
                    False,
                    f"shard {shard} of run directory {root}",
                )
            )
        for path, shared, what in locks:
            held.append((_take_lock(path, shared, what), path, shared))
        yield
    finally:
        for fd, path, shared in reversed(held):
            _release_lock(fd, path, shared)
        for path in created:  # innermost first
            try:
                path.rmdir()
            except OSError:
                break  # not empty: something was written


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
        raise RunDirError(
            f"{path} is a directory; give a file name"
            + (f" ending in {' or '.join(suffixes)}" if suffixes else "")
        )
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
    consolidated = rundir.consolidated_is_current()
    run = Run(run_dir, manifest, *(rundir.read_table(name, consolidated) for name in TABLES))
    check_run_ids(run)
    check_records(run)
    return run


def check_run_ids(run: Run) -> None:
    """Refuse records of another run than the manifest's (a directory that two runs wrote)."""
    expected = run.manifest.get("run_id")
    for name, frame in zip(TABLES, (run.nodes, run.steps, run.prompts)):
        others = sorted(set(frame["run_id"].unique()) - {expected}, key=str)
        if others:
            raise RunDirError(
                f"{run.path}: its manifest is run {expected}, but its {name} "
                f"records are of run {', '.join(map(str, others[:3]))}: the "
                "directory mixes two runs; measure again into a new directory, "
                "or --overwrite"
            )
