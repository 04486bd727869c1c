"""Sweeps: a grid of runs (pairs x trees x domains x decode settings) and executors that scale it out.

A sweep file (TOML) names a base run config and the axes of a grid::

    name = "coder-trees"
    base = "demo"                     # preset or run-config TOML every grid point starts from
    domains = ["code", "chat"]        # a domain name, or a table of [prompts] fields (file = ...)

    [defaults]                        # overrides of the base, in the run-config format
    max_new_tokens = 32
    prompts = { per_domain = 10 }

    [[pairs]]                         # fields of [pair]
    name = "coder"
    draft = "demo:draft"
    target = "demo:target"

    [[trees]]                         # fields of [tree]; a list expands into one tree per value
    policy = "chain"
    depth = [2, 4]                    # -> trees "chain-depth2" and "chain-depth4"

    [decode]                          # top-level or ``section.key`` settings; lists expand
    rendering = ["task", "raw"]

    [execution]                       # how, not what: never part of a run's identity
    prompts_per_shard = 8
    batch_size = 8                    # prompts measured together (default: as `specscope run`)

Every grid point is an ordinary run directory, ``SWEEP_DIR/runs/<label>`` (label = the axis names
joined by dots; a label that cannot be a file name gets a readable prefix and a digest, see
``GridPoint.dir_name``), and ``SWEEP_DIR/sweep.json`` is the sweep manifest, whose run
directories are confined to ``runs/`` when read. ``--overwrite`` removes only the runs of the
grid points the old sweep manifest lists whose own manifest names that sweep and point, and no
symbolic link in the sweep directory is followed, for writing or removing.

Work is cut into shards (one grid point x a block of its prompts). A shard loads its pair once,
measures its prompts and commits each one to the run directory as it finishes, so a finished prompt
is never measured again, a finished shard is never redone, and a shard retried after its worker died
overwrites the prompt it had in flight instead of duplicating it. Executors: ``local`` runs the
shards one after another in this process; ``ray`` submits each shard as a Ray task that declares the
GPUs (a cuda pair) or CPUs it needs, so Ray packs shards onto a cluster. When every shard of a run
is done, the run is consolidated and its manifest marked complete. The sweep directory may be a URI
that pyarrow's filesystems accept (``s3://bucket/sweeps/x``), so workers on other machines can write
to it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from .. import __version__
from ..files import read_json_object
from ..measure.checks import MeasureError, check_batch_size, default_batch_size
from ..models import resolve_source
from ..progress import Progress, Tally, observer
from ..prompts.items import PromptItem
from ..records import (
    RunDir,
    RunDirError,
    is_lock_file,
    json_bytes,
    open_location,
    read_json,
    remove_run,
    run_lock,
    write_file,
)
from ..run.manifest import config_differences, git_commit, now_utc, package_versions, run_manifest
from .executors import Shard, ShardResult, make_executor
from .grid import SWEEP_MANIFEST, SWEEP_SCHEMA_VERSION, Execution, GridPoint, SweepError, SweepSpec

# --- the sweep driver ----------------------------------------------------------------------------


@dataclass
class PointState:
    """A grid point as the driver sees it: where it lives, its prompts and what is done."""

    point: GridPoint
    run_dir: str
    writer: RunDir
    items: list[PromptItem]
    empty: list[str]
    manifest: dict | None  # the existing run manifest
    done: set[str]
    shards: list[Shard]
    complete: bool = False


@dataclass
class SweepSummary:
    sweep_dir: str
    sweep_id: str
    points: int
    points_complete: int
    shards_total: int
    shards_run: int  # in this invocation
    shards_skipped: int  # finished before this invocation
    prompts_measured: int  # in this invocation
    nodes: int  # in this invocation
    seconds: float
    executor: str

    @property
    def complete(self) -> bool:
        return self.points_complete == self.points


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def _location(fs: pafs.FileSystem, path: str) -> str:
    """A string a worker can open: the path on a local disk, a URI elsewhere."""
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    scheme = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs", "abfs": "abfs"}.get(fs.type_name)
    if scheme is None:
        raise SweepError(
            f"workers cannot open a {fs.type_name!r} filesystem; use a local path "
            "or an s3://, gs://, hdfs:// or abfs:// URI"
        )
    return f"{scheme}://{path}"


def _is_link(fs: pafs.FileSystem, path: str) -> bool:
    """Whether ``path`` is a symbolic link on a local disk (object stores have none)."""
    return isinstance(fs, pafs.LocalFileSystem) and os.path.islink(path)


def _refuse_links(fs: pafs.FileSystem, root: str, *parts: str) -> None:
    """Refuse a symbolic link at ``root/parts[0]``, ``root/parts[0]/parts[1]``, ...: a link
    planted in a sweep directory could point anywhere, and specscope writes and removes only
    what lies in the sweep directory itself."""
    for depth in range(1, len(parts) + 1):
        path = _join(root, *parts[:depth])
        if _is_link(fs, path):
            raise SweepError(
                f"{path} is a symbolic link; specscope neither writes nor removes "
                "through links in a sweep directory (remove the link)"
            )


def _names_point(manifest: dict | None, sweep_id: str | None, label: str) -> bool:
    """Whether a run manifest says it is grid point ``label`` of sweep ``sweep_id``."""
    sweep = manifest.get("sweep") if isinstance(manifest, dict) else None
    return (
        isinstance(sweep, dict)
        and sweep_id is not None
        and sweep.get("sweep_id") == sweep_id
        and sweep.get("label") == label
    )


def _read_manifest(writer: RunDir) -> dict | None:
    """A run's manifest (None where there is none), one that is not a readable JSON object
    refused as a SweepError naming its file."""
    try:
        return writer.read_manifest()
    except RunDirError as e:
        raise SweepError(f"{writer.root}/manifest.json cannot be read: {e}") from None


def plan_points(
    spec: SweepSpec,
    fs: pafs.FileSystem,
    root: str,
    execution: Execution,
    threads: int | None,
    fresh: bool = False,
    replaced: dict | None = None,
) -> list[PointState]:
    """Check every grid point's run directory and cut what is left into shards (no writes).

    ``fresh``: plan as if the directory were empty (it is about to be overwritten); ``replaced``:
    the manifest of the sweep being overwritten, whose own runs alone may be in the way.
    """
    states = []
    old_id = (replaced or {}).get("sweep_id")
    _refuse_links(fs, root, "shards")
    for point in spec.points():
        # a mistyped model path (or a revision of one) fails here, before anything is removed
        pair = point.config.pair
        resolve_source(pair.draft, pair.draft_revision)
        resolve_source(pair.target, pair.target_revision)
        _refuse_links(fs, root, "runs", point.dir_name)
        run_path = _join(root, "runs", point.dir_name)
        writer = RunDir(run_path, fs)
        manifest = _read_manifest(writer)
        if fresh:
            if manifest is not None and not _names_point(manifest, old_id, point.label):
                raise SweepError(
                    f"{run_path} holds a run that is not grid point {point.label} "
                    "of the sweep being overwritten; --overwrite removes only the "
                    "sweep's own runs: move it away first"
                )
            manifest = None
        if manifest is not None and manifest.get("run_id") != point.config.run_id:
            diff = config_differences(manifest, point.config)
            raise SweepError(
                f"{run_path} holds a run with another config (differs in: "
                f"{', '.join(diff)}); use another sweep directory or --overwrite"
            )
        items = point.config.prompts.select(point.config.seed)
        empty = [item.id for item in items if item.is_empty]
        items = [item for item in items if not item.is_empty]
        complete = bool(manifest and manifest.get("status") == "complete")
        done = (
            {item.id for item in items}
            if complete
            else set()
            if fresh
            else writer.done_prompt_ids()
        )
        batch_size = execution.batch_size or default_batch_size(point.config)
        try:
            check_batch_size(point.config, batch_size)
        except MeasureError as e:
            raise SweepError(f"grid point {point.label}: {e}") from None
        shards = []
        size = execution.prompts_per_shard
        for block, start in enumerate(range(0, len(items), size)):
            todo = tuple(
                (order, item)
                for order, item in enumerate(items[start : start + size], start)
                if item.id not in done
            )
            if todo:
                shards.append(
                    Shard(
                        f"{point.label}/{block}",
                        point.label,
                        _location(fs, run_path),
                        _location(fs, _join(root, "shards", f"{point.dir_name}.{block:04d}.json")),
                        point.config,
                        todo,
                        batch_size,
                        threads,
                    )
                )
        states.append(
            PointState(point, run_path, writer, items, empty, manifest, done, shards, complete)
        )
    return states


def _blocks(state: PointState, size: int) -> int:
    return -(-len(state.items) // size)


def _sweep_manifest(
    spec: SweepSpec,
    states: list[PointState],
    created: str,
    executor: str,
    execution: Execution,
    status: str,
) -> dict:
    points = [
        {
            "label": s.point.label,
            "run_id": s.point.config.run_id,
            "run_dir": f"runs/{s.point.dir_name}",
            "axes": dict(s.point.axes),
            "prompts": len(s.items),
            "status": "complete" if s.complete else "running",
        }
        for s in states
    ]
    return {
        "kind": "specscope-sweep",
        "schema_version": SWEEP_SCHEMA_VERSION,
        "specscope_version": __version__,
        "name": spec.name,
        "sweep_id": spec.sweep_id,
        "status": status,
        "created": created,
        "updated": now_utc(),
        "spec": spec.source,
        "executor": executor,
        "execution": dataclasses.asdict(execution),
        "packages": package_versions(),
        "git_commit": git_commit(),
        "points": points,
    }


def _check_sweep_dir(
    fs: pafs.FileSystem, root: str, spec: SweepSpec, overwrite: bool = False
) -> dict | None:
    """The sweep manifest already in ``root``, if any; raises when ``root`` holds anything else
    (even with ``overwrite``, which only replaces a sweep) or a sweep of other grid points."""
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        raise SweepError(f"{root} is a file, not a directory; give a sweep directory")
    existing = read_sweep_manifest(fs, root)
    if existing is None:
        if info.type == pafs.FileType.Directory and any(
            not is_lock_file(i.base_name)
            for i in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        ):
            raise SweepError(
                f"{root} exists and is not a specscope sweep (no {SWEEP_MANIFEST}); "
                "choose an empty or new directory (--overwrite only replaces a "
                "specscope sweep)"
            )
        return None
    if existing.get("kind") != "specscope-sweep":
        raise SweepError(f"{root}/{SWEEP_MANIFEST} is not a specscope sweep manifest")
    sweep_points(existing, _join(root, SWEEP_MANIFEST))  # every run_dir confined to the sweep
    if overwrite:
        return existing
    old = {p["label"]: p.get("run_id") for p in existing["points"]}
    changed = [p.label for p in spec.points() if p.label in old and old[p.label] != p.config.run_id]
    if changed:
        raise SweepError(
            f"{root} holds a sweep whose grid points {', '.join(changed)} had another "
            "config; use another directory, or --overwrite to start over"
        )
    return existing


def remove_sweep(fs: pafs.FileSystem, root: str, manifest: dict) -> list[str]:
    """Remove what specscope wrote in the sweep directory ``root`` whose sweep manifest is
    ``manifest``: its shard records, the manifest, and the run (see :func:`remove_run`) of each
    grid point the manifest lists whose own manifest names this sweep and that point. Any other
    file or directory stays, and no symbolic link is followed: a link is left where it is.
    Returns one warning per grid point directory that was left, naming it and why."""
    left = []
    sweep_id = manifest.get("sweep_id")
    runs = _join(root, "runs")
    if _is_link(fs, runs):
        left.append(f"left {runs}: a symbolic link (never followed)")
    for label, run_dir in [] if left else sweep_points(manifest, _join(root, SWEEP_MANIFEST)):
        path = _join(root, run_dir)
        if _is_link(fs, path):
            left.append(f"left {path}: a symbolic link (never followed)")
            continue
        if fs.get_file_info(path).type != pafs.FileType.Directory:
            continue
        try:
            point_manifest = _read_manifest(RunDir(path, fs))
        except SweepError:
            point_manifest = None
        if _names_point(point_manifest, sweep_id, label):
            remove_run(path, fs)
        else:
            left.append(
                f"left {path}: its manifest does not name grid point {label} of sweep {sweep_id}"
            )
    shards = _join(root, "shards")
    if _is_link(fs, shards):
        left.append(f"left {shards}: a symbolic link (never followed)")
    elif fs.get_file_info(shards).type == pafs.FileType.Directory:
        fs.delete_dir(shards)
    if (
        not _is_link(fs, runs)
        and fs.get_file_info(runs).type == pafs.FileType.Directory
        and not fs.get_file_info(pafs.FileSelector(runs))
    ):
        fs.delete_dir(runs)
    if fs.get_file_info(_join(root, SWEEP_MANIFEST)).type == pafs.FileType.File:
        fs.delete_file(_join(root, SWEEP_MANIFEST))
    return left


class SweepBoard:
    """The sweep's tallies (shards done, prompts, nodes, seconds per run), told to ``progress``."""

    def __init__(self, shards_total: int, shards_done: int, progress: Progress):
        self.progress = progress
        self.shards_total, self.shards_done = shards_total, shards_done
        self.prompts = self.nodes = 0  # of finished shards
        self.live_prompts = self.live_nodes = 0  # of the shard in flight (local executor)
        self.seconds: dict[str, float] = {}  # shard seconds per run label
        self.nodes_by_run: dict[str, int] = {}
        self.failures: list[ShardResult] = []
        self.t0 = time.perf_counter()

    def __enter__(self) -> SweepBoard:
        self.progress.start("sweep", "shards", self.tally())
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def tally(self) -> Tally:
        return Tally(
            self.shards_done,
            self.shards_total,
            self.prompts + self.live_prompts,
            self.nodes + self.live_nodes,
            time.perf_counter() - self.t0,
        )

    def prompt_done(self, nodes: int) -> None:
        self.live_prompts += 1
        self.live_nodes += nodes
        self.progress.update(self.tally())

    def shard_done(self, result: ShardResult) -> None:
        self.live_prompts = self.live_nodes = 0
        if result.error:
            self.failures.append(result)
            self.progress.note(f"shard {result.shard_id} failed: {result.error}", "error")
        self.prompts += result.prompts
        self.nodes += result.nodes
        self.seconds[result.label] = self.seconds.get(result.label, 0.0) + result.seconds
        self.nodes_by_run[result.label] = self.nodes_by_run.get(result.label, 0) + result.nodes
        self.shards_done += 1
        self.progress.update(self.tally())


def _open_runs(spec: SweepSpec, states: list[PointState]) -> None:
    """Write the manifest (status running) of every run that is not complete."""
    for s in states:
        if s.complete:
            continue
        old = s.manifest or {}
        s.manifest = run_manifest(
            s.point.config, s.items, s.empty, old.get("models", {}), old.get("created")
        )
        s.manifest["machines"] = old.get("machines", [])  # the workers' add theirs
        s.manifest["sweep"] = {
            "name": spec.name,
            "sweep_id": spec.sweep_id,
            "label": s.point.label,
            "axes": dict(s.point.axes),
        }
        s.writer.write_manifest(s.manifest)


def _close_runs(states: list[PointState], board: SweepBoard) -> None:
    """Consolidate every run whose prompts are all committed and mark it complete."""
    for s in states:
        if s.complete or not s.writer.done_prompt_ids() >= {item.id for item in s.items}:
            continue
        counts = s.writer.consolidate()
        seconds, nodes = (
            board.seconds.get(s.point.label, 0.0),
            board.nodes_by_run.get(s.point.label, 0),
        )
        s.manifest.update(
            status="complete",
            finished=now_utc(),
            counts=counts,
            timings={
                "last_invocation_shard_s": round(seconds, 3),
                "nodes_per_s": round(nodes / seconds, 3) if seconds else None,
            },
        )
        s.writer.write_manifest(s.manifest)
        s.complete = True


def run_sweep(
    spec: SweepSpec,
    out_dir: str | Path,
    executor: str = "local",
    address: str | None = None,
    execution: Execution | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> SweepSummary:
    """Run every grid point of ``spec`` into ``out_dir``, resuming what an earlier call left.

    ``out_dir`` is a local directory or a URI (``s3://bucket/sweeps/x``). Raises SweepError when
    a shard failed (after Ray's retries); the finished shards stay committed and the same call
    resumes the rest. On a local disk the sweep holds its directory's lock (:func:`run_lock`) for
    its life: a second sweep on the same directory is refused, naming the live one. ``progress``
    observes the shards (:mod:`specscope.progress`; none: silent).
    """
    fs, root = open_location(out_dir)
    if fs.get_file_info(root).type == pafs.FileType.File:
        raise SweepError(f"{root} is a file, not a directory; give a sweep directory")
    with run_lock(out_dir):
        return _run_sweep(
            spec, out_dir, executor, address, execution, overwrite, observer(progress)
        )


def _run_sweep(
    spec: SweepSpec,
    out_dir: str | Path,
    executor: str,
    address: str | None,
    execution: Execution | None,
    overwrite: bool,
    progress: Progress,
) -> SweepSummary:
    t_start = time.perf_counter()
    execution = execution or spec.execution
    backend = make_executor(executor, execution, address)
    fs, root = open_location(out_dir)
    existing = _check_sweep_dir(fs, root, spec, overwrite)
    states = plan_points(
        spec,
        fs,
        root,
        execution,
        backend.threads(),
        fresh=overwrite,
        replaced=existing if overwrite else None,
    )
    if overwrite and existing is not None:  # every input is checked: now remove the old sweep
        for warning in remove_sweep(fs, root, existing):
            progress.note(f"warning: {warning}", "warning")
        existing = None
    created = (existing or {}).get("created", now_utc())
    shards = [shard for s in states for shard in s.shards]
    shards.sort(key=lambda s: json.dumps(dataclasses.asdict(s.config.pair), sort_keys=True))
    shards_total = sum(_blocks(s, execution.prompts_per_shard) for s in states)

    def write_sweep_manifest(status: str) -> None:
        manifest = _sweep_manifest(spec, states, created, executor, execution, status)
        write_file(fs, _join(root, SWEEP_MANIFEST), json_bytes(manifest))

    write_sweep_manifest("running")
    _open_runs(spec, states)
    by_label = {s.point.label: s for s in states}

    def report(result: ShardResult) -> None:
        board.shard_done(result)
        state = by_label[result.label]
        machines = state.manifest.setdefault("machines", [])
        new_machine = result.machine is not None and result.machine not in machines
        if new_machine:
            machines.append(result.machine)
        if new_machine or (result.models and state.manifest.get("models") != result.models):
            if result.models:
                state.manifest["models"] = result.models  # provenance, as soon as a worker has it
            state.writer.write_manifest(state.manifest)

    # nothing to run: no progress shown
    quiet = progress if shards else observer(None)
    with SweepBoard(shards_total, shards_total - len(shards), quiet) as board:
        backend.run(shards, report, board.prompt_done)
    _close_runs(states, board)
    write_sweep_manifest("complete" if all(s.complete for s in states) else "incomplete")
    if board.failures:
        names = ", ".join(f.shard_id for f in board.failures[:5])
        raise SweepError(
            f"{len(board.failures)} shard(s) failed ({names}"
            f"{' ...' if len(board.failures) > 5 else ''}): {board.failures[0].error};"
            " the finished shards are kept: run the same command again to resume"
        )
    return SweepSummary(
        str(out_dir),
        spec.sweep_id,
        len(states),
        sum(s.complete for s in states),
        shards_total,
        len(shards),
        shards_total - len(shards),
        board.prompts,
        board.nodes,
        time.perf_counter() - t_start,
        executor,
    )


# --- reading a sweep -----------------------------------------------------------------------------


def read_sweep_manifest(fs: pafs.FileSystem, root: str) -> dict | None:
    """The sweep manifest (``sweep.json``) of ``root``, or None where there is none; one that is
    not a readable JSON object is refused, naming the file."""
    try:
        return read_json(fs, _join(root, SWEEP_MANIFEST))
    except RunDirError as e:
        raise SweepError(f"sweep manifest {e}") from None


def sweep_points(manifest: dict, where: str) -> list[tuple[str, str]]:
    """The (label, run_dir) of every grid point a sweep manifest lists, each run_dir a relative
    path ``runs/NAME`` inside the sweep; anything else (absolute, ``..``, a URI, a deeper path) is
    refused in one line naming ``where``: a crafted manifest must not point outside the sweep."""
    points = manifest.get("points")
    if not isinstance(points, list):
        raise SweepError(f"{where}: 'points' must be a list of grid points")
    out = []
    for i, point in enumerate(points):
        label = point.get("label") if isinstance(point, dict) else None
        run_dir = point.get("run_dir") if isinstance(point, dict) else None
        if not isinstance(label, str) or not isinstance(run_dir, str):
            raise SweepError(f"{where}: points[{i}] needs a string label and run_dir")
        parts = run_dir.split("/")
        if len(parts) != 2 or parts[0] != "runs" or parts[1] in ("", ".", "..") or "\\" in run_dir:
            raise SweepError(
                f"{where}: points[{i}].run_dir {run_dir!r} is not a directory "
                "runs/NAME inside the sweep; specscope reads no run outside it"
            )
        out.append((label, run_dir))
    return out


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / SWEEP_MANIFEST).is_file()


def sweep_run_dirs(sweep_dir: str | Path) -> list[Path]:
    """The run directories of a (local) sweep's grid points that hold records, in grid order;
    each confined to the sweep directory (see :func:`sweep_points`; a link there that leads
    outside the sweep is refused)."""
    sweep_dir = Path(sweep_dir)
    where = str(sweep_dir / SWEEP_MANIFEST)
    manifest = read_json_object(where, SweepError, "sweep manifest")
    inside = sweep_dir.resolve()
    dirs = []
    for _, run_dir in sweep_points(manifest, where):
        path = sweep_dir / run_dir
        if not path.resolve().is_relative_to(inside):
            raise SweepError(
                f"{where}: {path} is a link to {path.resolve()}, outside the sweep; "
                "specscope reads no run outside it"
            )
        dirs.append(path)
    dirs = [d for d in dirs if (d / "manifest.json").is_file()]
    if not dirs:
        raise SweepError(
            f"{sweep_dir}: the sweep has no run directories yet; run `specscope sweep` first"
        )
    return dirs


def expand_run_dirs(paths: list[Path]) -> list[Path]:
    """Each sweep directory replaced by its grid points' run directories; runs kept as they are."""
    out: list[Path] = []
    for path in paths:
        out.extend(sweep_run_dirs(path) if is_sweep_dir(path) else [path])
    return out
