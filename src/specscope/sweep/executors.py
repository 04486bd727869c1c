"""Shards (one grid point x a block of its prompts) and the executors that run them: ``local``
(one after another, in this process) and ``ray`` (one task a shard, packed onto a cluster).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..drafters import DrafterConfig
from ..measure.study import measure_prompts, start_prompts
from ..models import ModelPair, PairConfig, load_pair
from ..prompts.items import PromptItem
from ..records import RunDir, json_bytes, open_location, run_lock, write_file
from ..run.config import RunConfig
from ..run.manifest import now_utc, this_machine
from .grid import RAY_EXTRA_HINT, Execution, SweepError

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
    batch_size: int  # prompts measured together
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
    machine: dict | None = None  # run.manifest.this_machine(), where the shard measured prompts


class PairCache:
    """Holds the last loaded pair, so that consecutive shards of one pair load it once."""

    def __init__(self) -> None:
        self._key: tuple[PairConfig, DrafterConfig] | None = None
        self._pair: ModelPair | None = None

    def get(self, config: PairConfig, drafter: DrafterConfig = DrafterConfig()) -> ModelPair:
        if (config, drafter) != self._key:
            self._key, self._pair = None, None  # free the old pair before loading the new
            self._pair = load_pair(config, drafter)
            self._key = (config, drafter)
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


def run_shard(
    shard: Shard,
    pairs: PairCache | None = None,
    on_prompt: Callable[[int], None] | None = None,
    remap_gpus: bool = False,
) -> ShardResult:
    """Measure the shard's prompts that are not yet committed, committing each as it finishes,
    holding the shard's lock (:func:`run_lock`): an attempt of a shard whose earlier attempt is
    still alive (a Ray retry) is refused, and so is a shard of a run that a `run` is writing."""
    with run_lock(shard.run_dir, shard=shard.shard_id):
        return _run_shard(shard, pairs, on_prompt, remap_gpus)


def _run_shard(
    shard: Shard, pairs: PairCache | None, on_prompt: Callable[[int], None] | None, remap_gpus: bool
) -> ShardResult:
    t_start, cpu_start = time.perf_counter(), time.process_time()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    status_fs, status_path = open_location(shard.status_path)
    status = {
        "shard": shard.shard_id,
        "run": shard.label,
        "status": "running",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": now_utc(),
        "prompts": [item.id for _, item in shard.prompts],
    }
    write_file(status_fs, status_path, json_bytes(status))
    writer = RunDir(shard.run_dir)
    done = writer.done_prompt_ids()
    todo = [(order, item) for order, item in shard.prompts if item.id not in done]
    config, nodes, models = shard.config, 0, {}
    if todo:
        pair_config = visible_devices(config.pair) if remap_gpus else config.pair
        with torch_threads(shard.threads):
            pair = (pairs or PairCache()).get(pair_config, config.drafter)
            models = pair.provenance

            def commit(order: int, item: PromptItem, records) -> None:
                nonlocal nodes
                writer.commit_prompt(order, item.id, records.nodes, records.steps, records.prompt)
                nodes += records.nodes.num_rows
                if on_prompt is not None:
                    on_prompt(records.nodes.num_rows)

            measure_prompts(
                pair,
                config,
                start_prompts(pair, config, todo),
                config.run_id,
                commit,
                shard.batch_size,
            )
    seconds = time.perf_counter() - t_start
    status.update(
        status="done",
        finished=now_utc(),
        measured=len(todo),
        nodes=nodes,
        seconds=round(seconds, 3),
        cpu_seconds=round(time.process_time() - cpu_start, 3),
    )  # < seconds: CPU-starved
    write_file(status_fs, status_path, json_bytes(status))
    machine = this_machine() if todo else None
    return ShardResult(
        shard.shard_id, shard.label, len(todo), nodes, seconds, models, worker, machine=machine
    )


# --- executors -----------------------------------------------------------------------------------

Report = Callable[[ShardResult], None]


class LocalExecutor:
    """Runs the shards one after another in this process, reusing a loaded pair between them."""

    name = "local"

    def __init__(self, execution: Execution, address: str | None = None):
        if address:
            raise SweepError("--address is for the ray executor")
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


RAY_PROBE_S = 5.0  # seconds a Ray head has to accept a connection before the sweep is refused
RAY_GCS_PORT = 6379  # Ray's default head (GCS) port, for an address given without one


def probe_ray_head(address: str, timeout: float = RAY_PROBE_S) -> None:
    """Refuse a Ray head that does not accept a TCP connection within ``timeout`` seconds.

    ``address``: ``HOST:PORT`` (or ``ray://HOST:PORT``, or ``HOST`` for the default port).
    ``auto`` and a local Ray (None) are left to Ray. Without this, ``ray.init`` retries an
    unreachable head for minutes with no error.
    """
    text = address.partition("://")[2] if "://" in address else address
    host, colon, port = text.rpartition(":") if ":" in text else (text, "", "")
    host = host.strip("[]") if colon else text
    try:
        port_number = int(port) if colon else RAY_GCS_PORT
    except ValueError:
        raise SweepError(f"--address {address}: expected auto or HOST:PORT") from None
    try:
        socket.create_connection((host, port_number), timeout=timeout).close()
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise SweepError(
            f"cannot reach the Ray head at {address} ({reason} within "
            f"{timeout:g} s); start it with `ray start --head` or check the "
            "address"
        ) from None


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
        if address not in (None, "auto", "local"):
            probe_ray_head(address)  # before anything is written

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
                            result = ShardResult(
                                shard.shard_id, shard.label, 0, 0, 0.0, {}, "", error=_describe(e)
                            )
                        report(result)
            finally:
                for ref in pending:
                    ray.cancel(ref, force=True)


EXECUTORS = {"local": LocalExecutor, "ray": RayExecutor}


def make_executor(name: str, execution: Execution, address: str | None = None):
    if name not in EXECUTORS:
        raise SweepError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
    return EXECUTORS[name](execution, address)
