"""Where measurement's time goes, observed from outside: a stage breakdown of one run and the
machine's attainable throughput on the same linear layers.

:func:`instrumented` wraps, for the duration of a ``with`` block, the functions batched
measurement calls at each stage (the draft passes, the tree pass, the statistics, the cache
bookkeeping, the prefills of refilled rows, the record writing), the attention function
transformers looks up, and every linear layer of the pair (forward pre/post hooks), and restores
every one of them on exit. The wrappers pass arguments and results through untouched, so the
records of an instrumented run are those of a plain run, bit for bit; they only read clocks and
the linear layers' input shapes. Every linear call is counted: 2 x rows x in x out operations
(:func:`linear_ops`), and the (shape, rows) of each call is kept, so that
:func:`attainable` can time the same shapes at the same rows alone (:func:`time_linear`) and
say what throughput the machine reaches on exactly that work.

On a GPU the stages are timed with CUDA events on the current stream (no synchronisation inside
the run), resolved once the run is over; on the CPU with ``time.perf_counter``. This module runs
no measurement itself and decides nothing about prompts, batches or dtypes: the roofline
benchmark (``benchmarks/bench_roofline.py``) does.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch

from specscope.errors import SpecscopeError

# the stages of batched measurement, in the order the breakdown lists them
DRAFT, TREE, STATISTICS, CACHE, PREFILL, RECORDS = (
    "draft passes",
    "tree pass",
    "statistics",
    "cache bookkeeping",
    "prefills of refills",
    "record writing",
)
STAGES = (DRAFT, TREE, STATISTICS, CACHE, PREFILL, RECORDS)
# what runs inside the stages and is counted apart
LINEARS, LM_HEAD, ATTENTION = "linears", "LM head", "attention"
KERNELS = (LINEARS, LM_HEAD, ATTENTION)


class TimingError(SpecscopeError, RuntimeError):
    """Instrumentation that cannot be installed or read; the message says why."""


# --- clocks -------------------------------------------------------------------------------------


class Clock:
    """Intervals on the CPU: marks are ``time.perf_counter`` readings, summed as they close."""

    calls_per_timing = 1  # calls timed together by time_linear (a GPU queues them back to back)

    def mark(self) -> object:
        return time.perf_counter()

    def span(self, start: object, end: object) -> object:
        return end - start

    def seconds(self, spans: list) -> float:
        return float(sum(spans))

    def sync(self) -> None:
        """Wait for queued device work (nothing to wait for on the CPU)."""


class CudaClock(Clock):
    """Intervals on a GPU's current stream: marks are recorded CUDA events, read after one
    synchronisation at the end, so timing queues no host-device round trip."""

    calls_per_timing = 10

    def mark(self) -> object:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def span(self, start: object, end: object) -> object:
        return (start, end)

    def seconds(self, spans: list) -> float:
        self.sync()
        return sum(a.elapsed_time(b) for a, b in spans) / 1000

    def sync(self) -> None:
        torch.cuda.synchronize()


def clock_for(device: torch.device | str) -> Clock:
    """The clock that times work on ``device``."""
    return CudaClock() if torch.device(device).type == "cuda" else Clock()


# --- linear layers --------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class LinearShape:
    """One distinct linear layer shape of one model of the pair."""

    role: str  # "draft" or "target"
    in_features: int
    out_features: int
    head: bool  # the model's output layer (the LM head)

    @property
    def kernel(self) -> str:
        return LM_HEAD if self.head else LINEARS


def linear_ops(rows: int, in_features: int, out_features: int) -> int:
    """Operations of one linear call on ``rows`` rows: a multiply and an add per weight and row
    (2 x rows x in x out; the bias is left out)."""
    return 2 * rows * in_features * out_features


def is_linear(module: torch.nn.Module) -> bool:
    """A ``torch.nn.Linear`` or a module that stands for one (int8's ``Int8Linear``)."""
    return isinstance(module, torch.nn.Linear) or (
        hasattr(module, "in_features")
        and hasattr(module, "out_features")
        and not list(module.children())
    )


def linear_layers(role: str, model: torch.nn.Module) -> list[tuple[LinearShape, torch.nn.Module]]:
    """Every linear layer of ``model`` with its shape key (the output layer marked ``head``)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    return [
        (LinearShape(role, m.in_features, m.out_features, m is head), m)
        for m in model.modules()
        if is_linear(m)
    ]


# --- the recorder ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTime:
    """Time, operations and calls of one kind of work (linears, LM head, attention) in a stage."""

    name: str
    seconds: float
    ops: int  # 0 for attention (not counted)
    calls: int

    @property
    def gops(self) -> float:
        return self.ops / self.seconds / 1e9 if self.seconds > 0 else float("nan")


@dataclass(frozen=True)
class StageTime:
    """A stage's own time (stages nested in it taken out) and the kernels that ran in it."""

    name: str
    seconds: float
    calls: int
    kernels: tuple[KernelTime, ...]

    @property
    def kernel_seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)


@dataclass(frozen=True)
class Breakdown:
    """One instrumented run: wall time, each stage's time, and the linear calls by stage."""

    wall_s: float
    stages: tuple[StageTime, ...]  # "" is the work outside every stage (its kernels only)
    census: dict[tuple[str, LinearShape, int], int]  # (stage, shape, rows) -> calls

    @property
    def staged_s(self) -> float:
        return sum(s.seconds for s in self.stages if s.name)

    @property
    def other_s(self) -> float:
        """The remainder: the loop's own Python, prompt rendering, anything not in a stage."""
        return self.wall_s - self.staged_s

    @property
    def ops(self) -> int:
        return sum(k.ops for s in self.stages for k in s.kernels)

    @property
    def regions(self) -> int:
        """Timed regions: every stage call and every kernel call."""
        return sum(s.calls + sum(k.calls for k in s.kernels) for s in self.stages)

    def stage(self, name: str) -> StageTime | None:
        return next((s for s in self.stages if s.name == name), None)


@dataclass
class Recorder:
    """Open intervals on a stack; each closed one is added to its stage's or kernel's spans.

    A stage's span is added to it and taken from the stage it is nested in, so stage times do not
    overlap. A kernel belongs to the innermost open stage; a kernel inside a kernel is not
    timed apart (its time is its outer kernel's)."""

    clock: Clock
    stack: list[tuple[str, bool, object]] = field(default_factory=list)  # (name, is_stage, mark)
    spans: dict[tuple[str, str], list] = field(default_factory=dict)  # (stage, kernel or "")
    negative: dict[str, list] = field(default_factory=dict)  # nested stages' spans, per parent
    calls: Counter = field(default_factory=Counter)  # (stage, kernel or "") -> calls
    ops: Counter = field(default_factory=Counter)  # (stage, kernel) -> operations
    census: Counter = field(default_factory=Counter)  # (stage, LinearShape, rows) -> calls

    def current_stage(self) -> str:
        return next((name for name, is_stage, _ in reversed(self.stack) if is_stage), "")

    def in_kernel(self) -> bool:
        return any(not is_stage for _, is_stage, _ in self.stack)

    def enter(self, name: str, is_stage: bool) -> None:
        nested_kernel = not is_stage and self.in_kernel()
        self.stack.append((name, is_stage, None if nested_kernel else self.clock.mark()))

    def leave(self) -> None:
        name, is_stage, start = self.stack.pop()
        if start is None:  # a kernel inside a kernel: its time is the outer one's
            return
        span = self.clock.span(start, self.clock.mark())
        if is_stage:
            self.spans.setdefault((name, ""), []).append(span)
            self.calls[name, ""] += 1
            if parent := self.current_stage():
                self.negative.setdefault(parent, []).append(span)
        else:
            stage = self.current_stage()
            self.spans.setdefault((stage, name), []).append(span)
            self.calls[stage, name] += 1

    def count_linear(self, shape: LinearShape, rows: int) -> None:
        stage = self.current_stage()
        self.ops[stage, shape.kernel] += linear_ops(rows, shape.in_features, shape.out_features)
        self.census[stage, shape, rows] += 1

    @contextmanager
    def region(self, name: str, is_stage: bool) -> Iterator[None]:
        self.enter(name, is_stage)
        try:
            yield
        finally:
            self.leave()

    def breakdown(self, wall_s: float) -> Breakdown:
        """The stage times of the run (read once it is over)."""
        names = [s for s in STAGES if (s, "") in self.spans]
        names += sorted({s for s, _ in self.spans} - set(names))  # "" and any unknown stage
        stages = []
        for name in names:
            own = self.clock.seconds(self.spans.get((name, ""), []))
            own -= self.clock.seconds(self.negative.get(name, []))
            kernels = tuple(
                KernelTime(k, self.clock.seconds(spans), self.ops[name, k], self.calls[name, k])
                for k in KERNELS
                if (spans := self.spans.get((name, k)))
            )
            stages.append(StageTime(name, own, self.calls[name, ""], kernels))
        return Breakdown(wall_s, tuple(stages), dict(self.census))


# --- installing the instrumentation ------------------------------------------------------------------


def timed(recorder: Recorder, fn: Callable, name: str, is_stage: bool) -> Callable:
    """``fn`` inside a region of ``recorder``; arguments and result passed through."""

    def wrapper(*args, **kwargs):
        with recorder.region(name, is_stage):
            return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn
    return wrapper


@contextmanager
def swapped(owner: object, name: str, replacement: object) -> Iterator[None]:
    """``owner.name`` is ``replacement`` in the block, and what it was after (an attribute that
    a class inherited is deleted again rather than copied onto it)."""
    own = name in vars(owner)
    before = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, before)
        else:
            delattr(owner, name)


@contextmanager
def swapped_item(mapping: dict, key: str, replacement: object, absent: object) -> Iterator[None]:
    """``mapping[key]`` is ``replacement`` in the block, and what it was after (``absent`` where
    it held nothing: what a registration inside the block would have left)."""
    before = mapping.get(key, absent)
    mapping[key] = replacement
    try:
        yield
    finally:
        mapping[key] = before


def _stage_targets() -> list[tuple[object, str, str]]:
    """(owner, attribute, stage) of every function measurement calls at a stage, where the
    caller looks it up (the name its module imported)."""
    from specscope.core import batch
    from specscope.measure import study
    from specscope.records import RunDir

    return [
        (batch.Batch, "draft_tree", DRAFT),
        (batch, "verify", TREE),
        (batch, "softmax", STATISTICS),
        (study, "step_record", STATISTICS),
        (study, "certificate_records", STATISTICS),
        (batch, "keep_positions", CACHE),
        (batch, "gather_rows", CACHE),
        (batch, "prefill", PREFILL),
        (study, "finish_prompt", RECORDS),
        (RunDir, "commit_prompt", RECORDS),
        (RunDir, "consolidate", RECORDS),
        (RunDir, "write_manifest", RECORDS),
    ]


def _attention_swaps(recorder: Recorder) -> list:
    """Context managers that time the attention functions transformers looks up by name: SDPA,
    and the int8 pair's row-wise attention, also where a registration during the block
    (:func:`specscope.models.int8.use_rowwise_attention`) reads it from."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from specscope.models import int8

    mapping = type(ALL_ATTENTION_FUNCTIONS)._global_mapping
    sdpa, rowwise = mapping["sdpa"], int8.rowwise_attention
    timed_rowwise = timed(recorder, rowwise, ATTENTION, False)
    return [
        swapped(int8, "rowwise_attention", timed_rowwise),
        swapped_item(mapping, int8.ROWWISE_ATTENTION, timed_rowwise, rowwise),
        swapped_item(mapping, "sdpa", timed(recorder, sdpa, ATTENTION, False), sdpa),
    ]


def _hook_linears(recorder: Recorder, models: dict[str, torch.nn.Module]) -> list:
    """Forward pre/post hooks on every linear layer of ``models`` (role -> model); their handles.
    A module that two roles share is hooked once, under the first role."""
    handles, seen = [], set()
    for role, model in models.items():
        for shape, module in linear_layers(role, model):
            if id(module) in seen:
                continue
            seen.add(id(module))

            def pre(module, args, shape=shape):
                recorder.count_linear(shape, args[0].numel() // shape.in_features)
                recorder.enter(shape.kernel, False)

            def post(module, args, output):
                recorder.leave()

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


@contextmanager
def instrumented(models: dict[str, torch.nn.Module], clock: Clock) -> Iterator[Recorder]:
    """Time measurement's stages, the attention function and every linear layer of ``models``
    (role -> model) in the block; everything is restored on exit, also after an error."""
    recorder = Recorder(clock)
    handles: list = []
    with ExitStack() as stack:
        for owner, name, stage in _stage_targets():
            fn = getattr(owner, name)
            stack.enter_context(swapped(owner, name, timed(recorder, fn, stage, True)))
        for swap in _attention_swaps(recorder):
            stack.enter_context(swap)
        try:
            handles = _hook_linears(recorder, models)
            yield recorder
        finally:
            for handle in handles:
                handle.remove()


# --- attainable throughput --------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearTiming:
    """One linear shape timed alone at one row count."""

    shape: LinearShape
    rows: int
    seconds: float  # per call, the fastest of the repeats

    @property
    def gops(self) -> float:
        ops = linear_ops(self.rows, self.shape.in_features, self.shape.out_features)
        return ops / self.seconds / 1e9


@torch.inference_mode()
def time_linear(
    module: torch.nn.Module, rows: int, clock: Clock, min_seconds: float = 0.05, repeats: int = 3
) -> float:
    """Seconds per call of ``module``'s own forward on ``rows`` random rows of its input dtype
    and device: the fastest of at least ``repeats`` timings, more while their total is under
    ``min_seconds``, after one untimed call: the best this machine does on that shape. The
    device is synchronised around every timing, which holds ``clock.calls_per_timing`` calls
    (on a GPU, several queued back to back, as a run queues them)."""
    ref = next(itertools.chain(module.parameters(), module.buffers()))  # int8: its float pin row
    x = torch.randn(rows, module.in_features, dtype=ref.dtype, device=ref.device)
    module(x)
    times: list[float] = []
    calls = clock.calls_per_timing
    while len(times) < repeats or sum(times) * calls < min_seconds:
        clock.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            module(x)
        clock.sync()
        times.append((time.perf_counter() - t0) / calls)
        if len(times) >= 1000:
            break
    return min(times)


@dataclass(frozen=True)
class Attainable:
    """The machine's throughput on a set of linear calls, each shape timed alone."""

    ops: int
    seconds: float  # the calls' summed time at the timed speeds

    @property
    def gops(self) -> float:
        return self.ops / self.seconds / 1e9 if self.seconds > 0 else float("nan")


def attainable(calls: dict[tuple[LinearShape, int], int], timings: dict) -> Attainable:
    """Operations and time of ``calls`` ((shape, rows) -> calls) at ``timings``' speeds
    ((shape, rows) -> :class:`LinearTiming`); every (shape, rows) must have been timed."""
    missing = [key for key in calls if key not in timings]
    if missing:
        raise TimingError(f"no timing for {len(missing)} (shape, rows), e.g. {missing[0]}")
    ops = sum(n * linear_ops(r, s.in_features, s.out_features) for (s, r), n in calls.items())
    seconds = sum(n * timings[key].seconds for key, n in calls.items())
    return Attainable(ops, seconds)


def time_shapes(
    keys: set[tuple[LinearShape, int]],
    modules: dict[LinearShape, torch.nn.Module],
    clock: Clock,
    min_seconds: float = 0.05,
) -> dict[tuple[LinearShape, int], LinearTiming]:
    """Every (shape, rows) of ``keys`` timed alone on one module of that shape: its weights stay
    in the CPU's caches between calls, so small shapes run faster than any pass can run them
    (an upper bound; :func:`time_shapes_streamed` times them as a pass does)."""
    return {
        (shape, rows): LinearTiming(
            shape, rows, time_linear(modules[shape], rows, clock, min_seconds)
        )
        for shape, rows in sorted(keys)
    }


@torch.inference_mode()
def time_shapes_streamed(
    keys: set[tuple[LinearShape, int]],
    models: dict[str, torch.nn.Module],
    clock: Clock,
    min_seconds: float = 0.05,
    repeats: int = 3,
) -> dict[tuple[LinearShape, int], LinearTiming]:
    """Every (shape, rows) of ``keys`` timed as a forward pass runs it: each model's linear
    layers called once each, in the model's order, on ``rows`` random rows, so that every call
    reads its own weights from memory after the other layers' have passed through the caches.
    Per shape, the fastest of at least ``repeats`` passes (more while they total under
    ``min_seconds``) of its mean time per call."""
    out: dict[tuple[LinearShape, int], LinearTiming] = {}
    for role, rows in sorted({(shape.role, rows) for shape, rows in keys}):
        layers = linear_layers(role, models[role])
        ref = next(itertools.chain(layers[0][1].parameters(), layers[0][1].buffers()))
        inputs = {
            n: torch.randn(rows, n, dtype=ref.dtype, device=ref.device)
            for n in {shape.in_features for shape, _ in layers}
        }
        best: dict[LinearShape, float] = {}
        passes, spent = 0, 0.0
        while passes <= repeats or spent < min_seconds:  # pass 0: untimed
            per_shape: Counter = Counter()
            for shape, module in layers:
                clock.sync()
                t0 = time.perf_counter()
                module(inputs[shape.in_features])
                clock.sync()
                per_shape[shape] += time.perf_counter() - t0
            if passes:
                spent += sum(per_shape.values())
                for shape, seconds in per_shape.items():
                    best[shape] = min(best.get(shape, float("inf")), seconds)
            passes += 1
            if passes > 1000:
                break
        counts = Counter(shape for shape, _ in layers)
        for shape, seconds in best.items():
            if (shape, rows) in keys:
                out[shape, rows] = LinearTiming(shape, rows, seconds / counts[shape])
    return out


def shape_modules(models: dict[str, torch.nn.Module]) -> dict[LinearShape, torch.nn.Module]:
    """One module per distinct linear shape of ``models`` (role -> model)."""
    out: dict[LinearShape, torch.nn.Module] = {}
    for role, model in models.items():
        for shape, module in linear_layers(role, model):
            out.setdefault(shape, module)
    return out


def shape_counts(models: dict[str, torch.nn.Module]) -> Counter:
    """How many linear layers of each shape ``models`` hold (one forward pass calls each once)."""
    return Counter(
        shape for role, model in models.items() for shape, _ in linear_layers(role, model)
    )


@torch.inference_mode()
def region_overhead_s(clock: Clock, calls: int = 2000) -> float:
    """What timing one region costs: a hooked 4 x 4 linear's call minus a plain one's, each the
    best of 3 rounds of ``calls`` calls (on the clock's device). Times :attr:`Breakdown.regions`,
    an estimate of the instrumentation's own share of an instrumented run."""
    device = "cuda" if isinstance(clock, CudaClock) else "cpu"
    probe = torch.nn.Linear(4, 4, device=device)
    x = torch.randn(1, 4, device=device)

    def per_call() -> float:
        best = float("inf")
        for _ in range(3):
            clock.sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                probe(x)
            clock.sync()
            best = min(best, (time.perf_counter() - t0) / calls)
        return best

    plain = per_call()
    with instrumented({"probe": probe}, clock) as recorder:
        hooked = per_call()
        recorder.breakdown(0.0)  # CUDA: the events are read, as a run's are
    return max(hooked - plain, 0.0)
