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
    chat_template = [true, false]

    [execution]                       # how, not what: never part of a run's identity
    prompts_per_shard = 8

Every grid point is an ordinary run directory, ``SWEEP_DIR/runs/<label>`` (label = the axis names
joined by dots), and ``SWEEP_DIR/sweep.json`` is the sweep manifest. Work is cut into shards (one
grid point x a block of its prompts). A shard loads its pair once, measures its prompts and commits
each one to the run directory as it finishes, so a finished prompt is never measured again, a
finished shard is never redone, and a shard retried after its worker died overwrites the prompt it
had in flight instead of duplicating it. Executors: ``local`` runs the shards one after another in
this process; ``ray`` submits each shard as a Ray task that declares the GPUs (a cuda pair) or CPUs
it needs, so Ray packs shards onto a cluster. When every shard of a run is done, the run is
consolidated and its manifest marked complete. The sweep directory may be a URI that pyarrow's
filesystems accept (``s3://bucket/sweeps/x``), so workers on other machines can write to it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import socket
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import torch

from . import __version__
from .domains import PromptItem
from .engine import make_engine
from .models import ModelLoadError, ModelPair, PairConfig, load_pair, resolve_source
from .records import RunWriter, json_bytes, open_location, read_json, remove_run, write_file
from .runner import (
    PromptSpec,
    RunConfig,
    RunConfigError,
    git_commit,
    _package_versions,
    config_differences,
    load_config,
    measure_prompt,
    run_manifest,
)
from .trees import TreeConfig

from .errors import SpecscopeError

SWEEP_MANIFEST = "sweep.json"
SWEEP_SCHEMA_VERSION = 1
EXECUTORS = ("local", "ray")
RAY_EXTRA_HINT = "pip install 'specscope[ray]'"
AXES = {"pairs": "pair", "trees": "tree", "domains": "domain", "decode": "decode"}  # file key: axis


class SweepError(SpecscopeError, ValueError):
    """A sweep file, directory or execution that cannot go on; the message says why."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_=,+" else "_" for c in name)


# --- the sweep file ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One value of one grid axis: a name and the run-config settings it applies."""

    name: str
    settings: tuple[tuple[str, Any], ...]  # ("tree.policy", "chain"), ("max_new_tokens", 32), ...


@dataclass(frozen=True)
class Execution:
    """How shards are cut and scheduled; none of it changes a record."""

    prompts_per_shard: int = 8
    max_retries: int = 3  # Ray retries of a shard whose worker died
    cpus_per_shard: float = 1.0  # Ray num_cpus of a shard
    gpus_per_shard: float | None = None  # Ray num_gpus of a cuda shard; None: one per cuda device
    threads: int | None = None  # torch threads per shard; None: cpus_per_shard on Ray, default locally

    def __post_init__(self) -> None:
        if self.prompts_per_shard < 1:
            raise SweepError(f"prompts_per_shard must be >= 1, got {self.prompts_per_shard}")
        if self.max_retries < 0:
            raise SweepError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.cpus_per_shard <= 0:
            raise SweepError(f"cpus_per_shard must be > 0, got {self.cpus_per_shard}")
        if self.gpus_per_shard is not None and self.gpus_per_shard <= 0:
            raise SweepError(f"gpus_per_shard must be > 0, got {self.gpus_per_shard}")
        if self.threads is not None and self.threads < 1:
            raise SweepError(f"threads must be >= 1, got {self.threads}")

    def replace(self, **overrides) -> Execution:
        """A copy with the given fields set (None values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class GridPoint:
    """One run of the sweep: its label, the variant chosen on each axis, and its config."""

    label: str
    axes: tuple[tuple[str, str], ...]  # (axis, variant name), axis one of pair, tree, domain, decode
    config: RunConfig


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file: the base config and the variants of each axis."""

    name: str
    base: RunConfig
    pairs: tuple[Variant, ...] = ()
    trees: tuple[Variant, ...] = ()
    domains: tuple[Variant, ...] = ()
    decode: tuple[Variant, ...] = ()
    execution: Execution = field(default_factory=Execution)
    source: dict = field(default_factory=dict, compare=False)  # the file's contents

    def points(self) -> list[GridPoint]:
        """The grid: every combination of one variant per given axis, in file order."""
        axes = [(axis, getattr(self, axis)) for axis in AXES if getattr(self, axis)]
        points, seen = [], {}
        base = self.base.to_dict()
        for combo in itertools.product(*(variants for _, variants in axes)):
            label = ".".join(_safe(v.name) for v in combo) or "base"
            data = json.loads(json.dumps(base))
            for variant in combo:
                for key, value in variant.settings:
                    _set(data, key, value)
            try:
                config = RunConfig.from_dict(data)
            except (RunConfigError, ModelLoadError, TypeError, ValueError) as e:
                raise SweepError(f"grid point {label}: {e}") from None
            if label in seen:
                raise SweepError(f"two grid points are both labelled {label!r}; give the axis "
                                 "entries distinct names")
            seen[label] = config
            points.append(GridPoint(label, tuple((AXES[key], v.name) for (key, _), v in
                                                 zip(axes, combo)), config))
        return points

    @property
    def sweep_id(self) -> str:
        text = json.dumps([(p.label, p.config.run_id) for p in self.points()])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _set(data: dict, key: str, value: Any) -> None:
    section, _, name = key.rpartition(".")
    target = data
    for part in section.split(".") if section else ():
        if not isinstance(target.get(part), dict):
            raise SweepError(f"setting {key}: {part!r} is not a section of the run config")
        target = target[part]
    target[name] = value


def _merge(data: dict, overrides: dict, where: str) -> dict:
    out = dict(data)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, f"{where}.{key}")
        elif key not in out:
            raise SweepError(f"[{where}]: unknown key {key!r}; allowed: {sorted(out)}")
        else:
            out[key] = value
    return out


_SECTIONS = {"pairs": ("pair", PairConfig), "trees": ("tree", TreeConfig),
             "domains": ("prompts", PromptSpec)}


def _axis(axis: str, entries: Any) -> tuple[Variant, ...]:
    """Variants of the pairs, trees or domains axis; list values expand into one variant each."""
    section, kind = _SECTIONS[axis]
    fields = {f.name: f for f in dataclasses.fields(kind)}
    if not isinstance(entries, list):
        raise SweepError(f"{axis}: expected a list of tables ([[{axis}]]), got {type(entries).__name__}")
    if not entries:
        raise SweepError(f"{axis}: an empty list; give at least one entry, or leave the axis out "
                         "to keep the base's")
    variants = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str) and axis in ("trees", "domains"):
            entry = {"policy": entry} if axis == "trees" else {"name": entry, "domains": [entry]}
        if not isinstance(entry, dict):
            raise SweepError(f"{axis}[{i}]: expected a table, got {entry!r}")
        entry = dict(entry)
        name = entry.pop("name", None)
        unknown = sorted(set(entry) - set(fields))
        if unknown:
            raise SweepError(f"{axis}[{i}]: unknown keys {unknown}; allowed: name, {', '.join(fields)}")
        if name is None:
            name = {"pairs": f"pair{i}", "trees": str(entry.get("policy", f"tree{i}"))}.get(axis)
            if name is None:
                name = (Path(entry["file"]).stem if entry.get("file")
                        else "+".join(entry.get("domains", ())) or f"prompts{i}")
        grid = [k for k, v in entry.items() if isinstance(v, list) and k not in ("domains", "sources")]
        for k in grid:
            if not entry[k]:
                raise SweepError(f"{axis}[{i}].{k}: an empty list; give at least one value")
        for values in itertools.product(*(entry[k] for k in grid)):
            chosen = {**entry, **dict(zip(grid, values))}
            suffix = "".join(f"-{k}{v}" for k, v in zip(grid, values))
            if axis == "domains":  # a prompt set replaces the base's, keeping per_domain, sources
                chosen = {"file": None, "domains": [], "smoke": False, **chosen}
            settings = tuple((f"{section}.{k}", v) for k, v in chosen.items())
            variants.append(Variant(f"{name}{suffix}", settings))
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise SweepError(f"{axis}: two entries are both named {dup!r}; give each a distinct name")
    return tuple(variants)


def _decode(table: Any) -> tuple[Variant, ...]:
    """The decode axis: the product of every setting's values (a scalar is one value)."""
    if not isinstance(table, dict):
        raise SweepError(f"[decode]: expected a table of settings, got {table!r}")
    known = {f.name for f in dataclasses.fields(RunConfig)}
    for key in table:
        if key.partition(".")[0] not in known or key in ("pair", "tree", "prompts"):
            raise SweepError(f"[decode]: unknown setting {key!r}; use a run-config key "
                             f"({', '.join(sorted(known - {'pair', 'tree', 'prompts'}))}) "
                             "or section.key")
    keys = list(table)
    values = [v if isinstance(v, list) else [v] for v in table.values()]
    for key, v in zip(keys, values):
        if not v:
            raise SweepError(f"[decode].{key}: an empty list; give at least one value")
    named = [k for k, v in zip(keys, values) if len(v) > 1]
    variants = []
    for combo in itertools.product(*values):
        chosen = dict(zip(keys, combo))
        name = ",".join(f"{k.rpartition('.')[2]}={str(chosen[k]).lower()}" for k in named)
        variants.append(Variant(name or "decode", tuple(chosen.items())))
    return tuple(variants)


def parse_sweep(data: dict, name: str = "sweep") -> SweepSpec:
    """A sweep spec from the parsed contents of a sweep file."""
    allowed = {"name", "base", "defaults", "execution", *AXES}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SweepError(f"unknown sweep keys {unknown}; allowed: {sorted(allowed)}")
    try:
        base = load_config(data.get("base"))
        base = RunConfig.from_dict(_merge(base.to_dict(), data.get("defaults", {}), "defaults"))
    except (RunConfigError, ModelLoadError, TypeError, ValueError) as e:
        raise SweepError(f"base config: {e}") from None
    execution = data.get("execution", {})
    unknown = sorted(set(execution) - {f.name for f in dataclasses.fields(Execution)})
    if unknown:
        raise SweepError(f"[execution]: unknown keys {unknown}; allowed: "
                         f"{', '.join(f.name for f in dataclasses.fields(Execution))}")
    spec = SweepSpec(
        name=str(data.get("name", name)), base=base,
        pairs=_axis("pairs", data["pairs"]) if "pairs" in data else (),
        trees=_axis("trees", data["trees"]) if "trees" in data else (),
        domains=_axis("domains", data["domains"]) if "domains" in data else (),
        decode=_decode(data["decode"]) if "decode" in data else (),
        execution=Execution(**execution), source=data)
    spec.points()  # every grid point must be a valid run config
    return spec


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check a sweep file (TOML); the error names what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{path}: invalid TOML: {e}") from None
    try:
        return parse_sweep(data, name=path.stem)
    except SweepError as e:
        raise SweepError(f"{path}: {e}") from None


# --- shards --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """One grid point x a block of its prompts: the unit a worker runs."""

    shard_id: str  # "<label>/<block>"
    label: str
    run_dir: str  # absolute path or URI of the point's run directory
    status_path: str  # absolute path or URI of the shard's status file
    config: RunConfig
    prompts: tuple[tuple[int, PromptItem], ...]  # (order in the run, item)
    threads: int | None = None  # torch threads while it runs


@dataclass(frozen=True)
class ShardResult:
    """What a shard did; ``error`` is set where it failed."""

    shard_id: str
    label: str
    prompts: int  # measured by this attempt
    nodes: int
    seconds: float
    models: dict  # pair provenance, empty where no model was loaded
    worker: str  # host:pid
    error: str | None = None


class PairCache:
    """Holds the last loaded pair, so that consecutive shards of one pair load it once."""

    def __init__(self) -> None:
        self._config: PairConfig | None = None
        self._pair: ModelPair | None = None

    def get(self, config: PairConfig) -> ModelPair:
        if config != self._config:
            self._config, self._pair = None, None  # free the old pair before loading the new
            self._pair = load_pair(config)
            self._config = config
        return self._pair


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch threads (None: leave as is), restoring the count after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _cuda_devices(pair: PairConfig) -> list[str]:
    """The distinct cuda devices of a pair, in order (``cuda`` read as ``cuda:0``)."""
    devices = (pair.device, pair.draft_device or pair.device)
    return list(dict.fromkeys(d if ":" in d else f"{d}:0" for d in devices if d.startswith("cuda")))


def gpus_needed(pair: PairConfig) -> int:
    """The number of distinct cuda devices a pair uses (0 on CPU)."""
    return len(_cuda_devices(pair))


def visible_devices(pair: PairConfig) -> PairConfig:
    """The pair config as a Ray worker sees it: its cuda devices renumbered cuda:0, cuda:1, ...

    Ray sets CUDA_VISIBLE_DEVICES to the GPUs it gave the task, so ``cuda:3`` on the whole machine
    is ``cuda:0`` inside the task.
    """
    order = _cuda_devices(pair)

    def seen(device: str | None) -> str | None:
        if not (device and device.startswith("cuda")):
            return device
        return f"cuda:{order.index(device if ':' in device else f'{device}:0')}"

    return dataclasses.replace(pair, device=seen(pair.device), draft_device=seen(pair.draft_device))


def run_shard(shard: Shard, pairs: PairCache | None = None,
              on_prompt: Callable[[int], None] | None = None, remap_gpus: bool = False) -> ShardResult:
    """Measure the shard's prompts that are not yet committed, committing each as it finishes."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    status_fs, status_path = open_location(shard.status_path)
    status = {"shard": shard.shard_id, "run": shard.label, "status": "running",
              "pid": os.getpid(), "host": socket.gethostname(), "started": _now(),
              "prompts": [item.id for _, item in shard.prompts]}
    write_file(status_fs, status_path, json_bytes(status))
    writer = RunWriter(shard.run_dir)
    done = writer.done_prompt_ids()
    todo = [(order, item) for order, item in shard.prompts if item.id not in done]
    config, nodes, models = shard.config, 0, {}
    if todo:
        pair_config = visible_devices(config.pair) if remap_gpus else config.pair
        with torch_threads(shard.threads):
            pair = (pairs or PairCache()).get(pair_config)
            models = pair.provenance
            torch.manual_seed(config.seed)
            engine = make_engine(config.engine, pair.draft.model, pair.target.model,
                                 pair.vocab_size)
            shape, run_id = config.tree.shape(), config.run_id
            for order, item in todo:
                records = measure_prompt(engine, pair, item, config, shape, order, run_id)
                writer.commit_prompt(order, item.id, records.nodes, records.steps, records.prompt)
                nodes += records.nodes.num_rows
                if on_prompt is not None:
                    on_prompt(records.nodes.num_rows)
    seconds = time.perf_counter() - t_start
    status.update(status="done", finished=_now(), measured=len(todo), nodes=nodes,
                  seconds=round(seconds, 3),
                  cpu_seconds=round(time.process_time() - cpu_start, 3))  # < seconds: CPU-starved
    write_file(status_fs, status_path, json_bytes(status))
    return ShardResult(shard.shard_id, shard.label, len(todo), nodes, seconds, models, worker)


# --- executors -----------------------------------------------------------------------------------

Report = Callable[[ShardResult], None]


class LocalExecutor:
    """Runs the shards one after another in this process, reusing a loaded pair between them."""

    name = "local"

    def __init__(self, execution: Execution):
        self.execution = execution

    def threads(self) -> int | None:
        return self.execution.threads

    def run(self, shards: list[Shard], report: Report, on_prompt: Callable[[int], None]) -> None:
        pairs = PairCache()
        for shard in shards:
            report(run_shard(shard, pairs, on_prompt))


_WORKER_PAIRS = PairCache()  # one per Ray worker process: reused by the shards it runs


def _ray_shard(shard: Shard) -> ShardResult:
    """The body of a Ray task: one shard, on the GPUs or CPUs Ray gave it."""
    return run_shard(shard, _WORKER_PAIRS, remap_gpus=True)


def _describe(error: BaseException) -> str:
    cause = getattr(error, "cause", None)  # a RayTaskError wraps the worker's exception
    error = cause if isinstance(cause, BaseException) else error
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[-1] if text else ''}"


def import_ray():
    """The ray module, or a SweepError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise SweepError(f"the ray executor needs Ray: {RAY_EXTRA_HINT}") from None
    return ray


class RayExecutor:
    """Submits each shard as a Ray task with its resources declared; Ray packs and retries them.

    ``address``: None starts a local Ray instance (all of this machine's CPUs and GPUs) unless one
    is already initialised in this process; ``auto`` or ``HOST:PORT`` joins a running cluster.
    """

    name = "ray"

    def __init__(self, execution: Execution, address: str | None = None):
        self.execution = execution
        self.address = address
        self.ray = import_ray()

    def threads(self) -> int | None:
        return self.execution.threads or max(1, int(self.execution.cpus_per_shard))

    def resources(self, shard: Shard) -> dict[str, float]:
        gpus = gpus_needed(shard.config.pair)
        out = {"num_cpus": self.execution.cpus_per_shard}
        if gpus:
            out["num_gpus"] = self.execution.gpus_per_shard or gpus
        return out

    @contextmanager
    def session(self) -> Iterator[None]:
        ray = self.ray
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.address, include_dashboard=False)
        try:
            yield
        finally:
            if started:
                ray.shutdown()

    def run(self, shards: list[Shard], report: Report, on_prompt: Callable[[int], None]) -> None:
        ray = self.ray
        with self.session():
            task = ray.remote(max_retries=self.execution.max_retries)(_ray_shard)
            pending = {task.options(**self.resources(s)).remote(s): s for s in shards}
            try:
                while pending:
                    ready, _ = ray.wait(list(pending), num_returns=1)
                    for ref in ready:
                        shard = pending.pop(ref)
                        try:
                            result = ray.get(ref)
                        except Exception as e:  # the task failed, or its worker died for good
                            result = ShardResult(shard.shard_id, shard.label, 0, 0, 0.0, {}, "",
                                                 error=_describe(e))
                        report(result)
            finally:
                for ref in pending:
                    ray.cancel(ref, force=True)


def make_executor(name: str, execution: Execution, address: str | None = None):
    if name == "local":
        if address:
            raise SweepError("--address is for the ray executor")
        return LocalExecutor(execution)
    if name == "ray":
        return RayExecutor(execution, address)
    raise SweepError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")


# --- the sweep driver ----------------------------------------------------------------------------


@dataclass
class PointState:
    """A grid point as the driver sees it: where it lives, its prompts and what is done."""

    point: GridPoint
    run_dir: str
    writer: RunWriter
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
        raise SweepError(f"workers cannot open a {fs.type_name!r} filesystem; use a local path "
                         "or an s3://, gs://, hdfs:// or abfs:// URI")
    return f"{scheme}://{path}"


def plan_points(spec: SweepSpec, fs: pafs.FileSystem, root: str, execution: Execution,
                threads: int | None, fresh: bool = False) -> list[PointState]:
    """Check every grid point's run directory and cut what is left into shards (no writes).

    ``fresh``: plan as if the directory were empty (it is about to be overwritten).
    """
    states = []
    for point in spec.points():
        for source in (point.config.pair.draft, point.config.pair.target):
            resolve_source(source)  # a mistyped model path fails here, before anything is removed
        run_path = _join(root, "runs", point.label)
        writer = RunWriter(run_path, fs)
        manifest = None if fresh else writer.read_manifest()
        if manifest is not None and manifest.get("run_id") != point.config.run_id:
            diff = config_differences(manifest, point.config)
            raise SweepError(f"{run_path} holds a run with another config (differs in: "
                             f"{', '.join(diff)}); use another sweep directory or --overwrite")
        items = point.config.prompts.select(point.config.seed)
        empty = [item.id for item in items if item.is_empty]
        items = [item for item in items if not item.is_empty]
        complete = bool(manifest and manifest.get("status") == "complete")
        done = ({item.id for item in items} if complete
                else set() if fresh else writer.done_prompt_ids())
        shards = []
        size = execution.prompts_per_shard
        for block, start in enumerate(range(0, len(items), size)):
            todo = tuple((order, item) for order, item in enumerate(items[start:start + size], start)
                         if item.id not in done)
            if todo:
                shards.append(Shard(
                    f"{point.label}/{block}", point.label, _location(fs, run_path),
                    _location(fs, _join(root, "shards", f"{point.label}.{block:04d}.json")),
                    point.config, todo, threads))
        states.append(PointState(point, run_path, writer, items, empty, manifest, done, shards,
                                 complete))
    return states


def _blocks(state: PointState, size: int) -> int:
    return -(-len(state.items) // size)


def _sweep_manifest(spec: SweepSpec, states: list[PointState], created: str, executor: str,
                    execution: Execution, status: str) -> dict:
    points = [{"label": s.point.label, "run_id": s.point.config.run_id,
               "run_dir": f"runs/{s.point.label}", "axes": dict(s.point.axes),
               "prompts": len(s.items), "status": "complete" if s.complete else "running"}
              for s in states]
    return {
        "kind": "specscope-sweep",
        "schema_version": SWEEP_SCHEMA_VERSION,
        "specscope_version": __version__,
        "name": spec.name,
        "sweep_id": spec.sweep_id,
        "status": status,
        "created": created,
        "updated": _now(),
        "spec": spec.source,
        "executor": executor,
        "execution": dataclasses.asdict(execution),
        "packages": _package_versions(),
        "git_commit": git_commit(),
        "points": points,
    }


def _check_sweep_dir(fs: pafs.FileSystem, root: str, spec: SweepSpec,
                     overwrite: bool = False) -> dict | None:
    """The sweep manifest already in ``root``, if any; raises when ``root`` holds anything else
    (even with ``overwrite``, which only replaces a sweep) or a sweep of other grid points."""
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        raise SweepError(f"{root} is a file, not a directory; give a sweep directory")
    existing = read_json(fs, _join(root, SWEEP_MANIFEST))
    if existing is None:
        if info.type == pafs.FileType.Directory and fs.get_file_info(
                pafs.FileSelector(root, allow_not_found=True)):
            raise SweepError(f"{root} exists and is not a specscope sweep (no {SWEEP_MANIFEST}); "
                             "choose an empty or new directory (--overwrite only replaces a "
                             "specscope sweep)")
        return None
    if existing.get("kind") != "specscope-sweep":
        raise SweepError(f"{root}/{SWEEP_MANIFEST} is not a specscope sweep manifest")
    if overwrite:
        return existing
    old = {p["label"]: p["run_id"] for p in existing.get("points", [])}
    changed = [p.label for p in spec.points() if p.label in old and old[p.label] != p.config.run_id]
    if changed:
        raise SweepError(f"{root} holds a sweep whose grid points {', '.join(changed)} had another "
                         "config; use another directory, or --overwrite to start over")
    return existing


def remove_sweep(fs: pafs.FileSystem, root: str) -> None:
    """Remove what specscope wrote in a sweep directory: its manifest, shard records and every
    grid point's run (see :func:`remove_run`), leaving any other file."""
    for info in fs.get_file_info(pafs.FileSelector(_join(root, "runs"), allow_not_found=True)):
        if info.type == pafs.FileType.Directory:
            remove_run(info.path, fs)
    for sub in ("runs", "shards"):
        path = _join(root, sub)
        if fs.get_file_info(path).type == pafs.FileType.Directory and (
                sub == "shards" or not fs.get_file_info(pafs.FileSelector(path))):
            fs.delete_dir(path)
    if fs.get_file_info(_join(root, SWEEP_MANIFEST)).type == pafs.FileType.File:
        fs.delete_file(_join(root, SWEEP_MANIFEST))


class SweepBoard:
    """The sweep's one progress display (shards done, prompts, nodes, nodes/s) and its tallies."""

    def __init__(self, shards_total: int, shards_done: int, enabled: bool):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self.console = Console(stderr=True)
        self.bar = Progress(
            TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
            TextColumn("shards  {task.fields[prompts]} prompts  {task.fields[nodes]} nodes  "
                       "{task.fields[rate]} nodes/s"),
            TimeElapsedColumn(), console=self.console, disable=not enabled)
        self.task = self.bar.add_task("sweep", total=shards_total, completed=shards_done,
                                      prompts=0, nodes=0, rate="-")
        self.prompts = self.nodes = 0  # of finished shards
        self.live_prompts = self.live_nodes = 0  # of the shard in flight (local executor)
        self.seconds: dict[str, float] = {}  # shard seconds per run label
        self.nodes_by_run: dict[str, int] = {}
        self.failures: list[ShardResult] = []
        self.t0 = time.perf_counter()

    def __enter__(self) -> SweepBoard:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def _show(self) -> None:
        nodes = self.nodes + self.live_nodes
        rate = nodes / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.update(self.task, prompts=self.prompts + self.live_prompts, nodes=nodes,
                        rate=f"{rate:.1f}")

    def prompt_done(self, nodes: int) -> None:
        self.live_prompts += 1
        self.live_nodes += nodes
        self._show()

    def shard_done(self, result: ShardResult) -> None:
        self.live_prompts = self.live_nodes = 0
        if result.error:
            self.failures.append(result)
            self.console.print(f"[red]shard {result.shard_id} failed: {result.error}")
        self.prompts += result.prompts
        self.nodes += result.nodes
        self.seconds[result.label] = self.seconds.get(result.label, 0.0) + result.seconds
        self.nodes_by_run[result.label] = self.nodes_by_run.get(result.label, 0) + result.nodes
        self.bar.update(self.task, advance=1)
        self._show()


def _open_runs(spec: SweepSpec, states: list[PointState]) -> None:
    """Write the manifest (status running) of every run that is not complete."""
    for s in states:
        if s.complete:
            continue
        old = s.manifest or {}
        s.manifest = run_manifest(s.point.config, s.items, s.empty, old.get("models", {}),
                                  old.get("created"))
        s.manifest["sweep"] = {"name": spec.name, "sweep_id": spec.sweep_id,
                               "label": s.point.label, "axes": dict(s.point.axes)}
        s.writer.write_manifest(s.manifest)


def _close_runs(states: list[PointState], board: SweepBoard) -> None:
    """Consolidate every run whose prompts are all committed and mark it complete."""
    for s in states:
        if s.complete or not s.writer.done_prompt_ids() >= {item.id for item in s.items}:
            continue
        counts = s.writer.consolidate()
        seconds, nodes = board.seconds.get(s.point.label, 0.0), board.nodes_by_run.get(s.point.label, 0)
        s.manifest.update(status="complete", finished=_now(), counts=counts,
                          timings={"last_invocation_shard_s": round(seconds, 3),
                                   "nodes_per_s": round(nodes / seconds, 3) if seconds else None})
        s.writer.write_manifest(s.manifest)
        s.complete = True


def run_sweep(spec: SweepSpec, out_dir: str | Path, executor: str = "local",
              address: str | None = None, execution: Execution | None = None,
              overwrite: bool = False, progress: bool = True) -> SweepSummary:
    """Run every grid point of ``spec`` into ``out_dir``, resuming what an earlier call left.

    ``out_dir`` is a local directory or a URI (``s3://bucket/sweeps/x``). Raises SweepError when
    a shard failed (after Ray's retries); the finished shards stay committed and the same call
    resumes the rest.
    """
    t_start = time.perf_counter()
    execution = execution or spec.execution
    backend = make_executor(executor, execution, address)
    fs, root = open_location(out_dir)
    existing = _check_sweep_dir(fs, root, spec, overwrite)
    states = plan_points(spec, fs, root, execution, backend.threads(), fresh=overwrite)
    if overwrite and existing is not None:  # every input is checked: now remove the old sweep
        remove_sweep(fs, root)
        existing = None
    created = (existing or {}).get("created", _now())
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
        if result.models and state.manifest.get("models") != result.models:
            state.manifest["models"] = result.models  # provenance, as soon as a worker has it
            state.writer.write_manifest(state.manifest)

    with SweepBoard(shards_total, shards_total - len(shards), progress and bool(shards)) as board:
        backend.run(shards, report, board.prompt_done)
    _close_runs(states, board)
    write_sweep_manifest("complete" if all(s.complete for s in states) else "incomplete")
    if board.failures:
        names = ", ".join(f.shard_id for f in board.failures[:5])
        raise SweepError(f"{len(board.failures)} shard(s) failed ({names}"
                         f"{' ...' if len(board.failures) > 5 else ''}): {board.failures[0].error};"
                         " the finished shards are kept: run the same command again to resume")
    return SweepSummary(str(out_dir), spec.sweep_id, len(states), sum(s.complete for s in states),
                        shards_total, len(shards), shards_total - len(shards), board.prompts,
                        board.nodes, time.perf_counter() - t_start, executor)


# --- reading a sweep -----------------------------------------------------------------------------


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / SWEEP_MANIFEST).is_file()


def sweep_run_dirs(sweep_dir: str | Path) -> list[Path]:
    """The run directories of a (local) sweep's grid points that hold records, in grid order."""
    sweep_dir = Path(sweep_dir)
    try:
        manifest = json.loads((sweep_dir / SWEEP_MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SweepError(f"{sweep_dir}: cannot read {SWEEP_MANIFEST}: {e}") from e
    dirs = [sweep_dir / p["run_dir"] for p in manifest.get("points", [])]
    dirs = [d for d in dirs if (d / "manifest.json").is_file()]
    if not dirs:
        raise SweepError(f"{sweep_dir}: the sweep has no run directories yet; run "
                         "`specscope sweep` first")
    return dirs


def expand_run_dirs(paths: list[Path]) -> list[Path]:
    """Each sweep directory replaced by its grid points' run directories; runs kept as they are."""
    out: list[Path] = []
    for path in paths:
        out.extend(sweep_run_dirs(path) if is_sweep_dir(path) else [path])
    return out


__all__ = ["EXECUTORS", "Execution", "GridPoint", "LocalExecutor", "PairCache", "RayExecutor",
           "Shard", "ShardResult", "SweepError", "SweepSpec", "SweepSummary", "Variant",
           "expand_run_dirs", "is_sweep_dir", "load_sweep", "parse_sweep", "run_shard",
           "run_sweep", "sweep_run_dirs"]
