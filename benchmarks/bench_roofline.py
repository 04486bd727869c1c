"""Measurement against the machine's own limit: achieved / attainable linear throughput, per dtype
and batch size, with a stage breakdown, in one process.

    python benchmarks/bench_roofline.py [--pair demo|random|tiny] [--dtypes bfloat16 int8]
        [--sizes 1 8] [--device cpu|cuda] [--per-domain 2] [--max-new-tokens 32]
        [--paths TREE] [--prompts FILE.jsonl] [--min-seconds 0.05] [--out FILE.json]

For every (dtype, batch size) cell, on the same prompts (``--per-domain`` offline prompts per
domain, or ``--prompts``) and tree (the paper tree, or ``--paths``):

0. an untimed warm-up: the same prompts with 2 new tokens (every prefill and step shape once);
1. the measurement runs plainly (``run_study``), timed: its nodes per second;
2. it runs again with every stage, the attention function and every linear layer timed from
   outside (:mod:`lab.stages_timing`); its records must equal the plain run's bit
   for bit (timing columns aside). The instrumentation's cost is shown twice: the extra wall
   time over the plain run (noisy on a shared machine) and the timed regions x what timing one
   region costs (a hooked call minus a plain one);
3. every (linear shape, rows) the run executed is timed with the module's own forward
   (Int8Linear for int8): on a CPU as a pass runs it (each model's linear layers called in order,
   so every call reads its weights from memory), on a GPU each shape alone; the attainable
   throughput on that same work, prefills included. On a CPU each shape is also timed alone, its
   weights then staying in the caches between calls: an upper bound no pass reaches, printed
   beside. Achieved = the linear operations counted (2 x rows x in x out per call; attention
   is not counted) / the plain run's wall; the headline is achieved / attainable. The attainable
   throughput of one full step (the tree's row counts at the batch size: draft B x 1 at the
   context and B x frontier per level, target B x (1 + scored nodes)) is printed beside it,
   with each shape's GOP/s at those rows.

The stage table splits the instrumented run's wall: draft passes (the draft's forwards, top-k
and softmax over the vocabulary), the tree pass, statistics (the target's softmax, the node and
certificate records), cache bookkeeping (keep_positions, gather_rows), prefills of refilled rows,
record writing, and the remainder (the loop's own Python, prompt rendering); each model stage
with its linears, LM head and attention, and their GOP/s beside the attainable GOP/s.

``--pair demo`` loads the demo pair; ``random`` builds random weights of the demo pair's shapes
(Qwen2 1.5B target, 0.5B draft, an untied LM head as the converted GGUF has it); ``tiny`` a tiny
random Qwen2 pair (the test's). Random pairs use a byte-level tokenizer (no downloads), so their
prompts are 3 to 4 times as many tokens as with the demo tokenizer (cut at 512 from the left).
int8 is float32 with int8 linear layers (CPU only). The device is synchronised before every
clock read; on a GPU the stages are timed with CUDA events, and torch's deterministic kernels are
on, as ``load_pair`` sets them (with the defaults two runs differ). A GPU machine without the
offline prompt packages takes ``--prompts benchmarks/data/prompts-2-per-domain.jsonl`` (2 offline
prompts per domain).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from specscope.doctor import hardware
from specscope.errors import SpecscopeError
from specscope.models import ModelPair, PairConfig, load_pair
from specscope.models.config import LoadedModel
from specscope.models.int8 import quantize_int8, use_rowwise_attention
from specscope.models.load import check_device, reproducible_on
from specscope.records import TIMING_COLUMNS, load_run
from specscope.run.config import PromptSpec, RunConfig
from specscope.run.manifest import git_commit
from specscope.run.study import run_study
from specscope.trees import TreeConfig, TreeShape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sweep import byte_tokenizer  # noqa: E402  (the benchmarks' byte-level tokenizer)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/, in a checkout
from lab.stages_timing import (  # noqa: E402
    STAGES,
    Attainable,
    Breakdown,
    LinearShape,
    LinearTiming,
    attainable,
    clock_for,
    instrumented,
    region_overhead_s,
    shape_counts,
    shape_modules,
    time_shapes,
    time_shapes_streamed,
)

DTYPES = ("bfloat16", "float32", "int8")
PAIR_KINDS = ("demo", "random", "tiny")
DOMAINS = ("code", "math", "reasoning", "chat")
# the demo pair's shapes, as its converted GGUF checkpoints load (lm_head stored apart)
QWEN2_SIZES = {
    "target": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
    ),
    "draft": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
    ),
}
TINY_SIZES = {
    "target": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    ),
    "draft": dict(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    ),
}
SEEDS = {"target": 2, "draft": 1}


class BenchError(SpecscopeError, ValueError):
    """A benchmark option that cannot run here; the message says what is allowed."""


# --- pairs ------------------------------------------------------------------------------------------


def pair_config(kind: str, dtype: str, device: str) -> PairConfig:
    """The pair's config as a run records it (random pairs are named ``random:draft``, ...)."""
    if dtype == "int8" and not device.startswith("cpu"):
        raise BenchError(
            f"int8 runs on the CPU only (fbgemm int8 linears); got --device {device}: "
            "use --device cpu for int8, or bfloat16/float32 on a GPU"
        )
    check_device(device)
    sources = {} if kind == "demo" else {"draft": f"{kind}:draft", "target": f"{kind}:target"}
    if dtype == "int8":
        return PairConfig(**sources, dtype="float32", quantize="int8", device=device)
    return PairConfig(**sources, dtype=dtype, device=device)


def qwen2_config(kind: str, role: str, vocab: int):
    """The transformers config of a random pair's ``role``: the demo pair's sizes (``random``)
    or tiny ones, on SDPA."""
    from transformers import Qwen2Config

    qwen = Qwen2Config(
        vocab_size=vocab,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **(QWEN2_SIZES if kind == "random" else TINY_SIZES)[role],
    )
    qwen._attn_implementation = "sdpa"
    return qwen


def random_model(kind: str, role: str, vocab: int, config: PairConfig) -> torch.nn.Module:
    """A random-weight Qwen2 model of ``role``'s shapes, on the config's device and dtype, its
    final norm scaled so that its distributions are peaked like a trained model's."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(SEEDS[role])
    with torch.device(config.device):
        model = Qwen2ForCausalLM(qwen2_config(kind, role, vocab))
    model.to(getattr(torch, config.dtype)).eval().requires_grad_(False)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    return model


def build_pair(kind: str, config: PairConfig) -> ModelPair:
    """The demo pair as ``load_pair`` loads it, or a random pair built here the same way
    (int8: every linear quantised, the target on row-wise attention)."""
    if kind == "demo":
        return load_pair(config)
    tokenizer = byte_tokenizer()
    vocab = len(tokenizer) if kind == "tiny" else 151936
    loaded = {}
    for role in ("draft", "target"):
        model = random_model(kind, role, vocab, config)
        parameters = sum(p.numel() for p in model.parameters())
        if config.quantize == "int8":
            quantize_int8(model)
        loaded[role] = LoadedModel(
            model, tokenizer, f"{kind}:{role}", f"{kind}:{role}", None, parameters
        )
    if config.quantize == "int8":
        use_rowwise_attention(loaded["target"].model)
    provenance = {
        role: {"source": m.source, "parameters": m.parameters} for role, m in loaded.items()
    }
    return ModelPair(loaded["draft"], loaded["target"], vocab, provenance)


def pair_models(pair: ModelPair) -> dict[str, torch.nn.Module]:
    return {"draft": pair.draft.model, "target": pair.target.model}


# --- one cell ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One (dtype, batch size) measured: plain and instrumented, and the linear timings."""

    dtype: str
    batch: int
    nodes: int
    plain_s: float
    instrumented_s: float
    records_identical: bool
    breakdown: Breakdown
    timings: dict[tuple[LinearShape, int], LinearTiming]
    run: Attainable  # the run's linear calls at the attainable speeds
    step: Attainable  # one full step's nominal calls at the attainable speeds
    step_rows: dict[str, tuple[int, ...]]  # role -> rows of each pass of a full step
    region_cost_s: float  # what timing one region costs (a hooked call minus a plain one)
    hot: Attainable  # the run's calls, each shape timed alone, its weights in the caches

    @property
    def hot_ratio(self) -> float:
        return self.achieved_gops / self.hot.gops

    @property
    def achieved_gops(self) -> float:
        return self.breakdown.ops / self.plain_s / 1e9

    @property
    def ratio(self) -> float:
        return self.achieved_gops / self.run.gops

    @property
    def overhead(self) -> float:
        """The instrumented run's extra wall time over the plain run's, as a share of it."""
        return self.instrumented_s / self.plain_s - 1

    @property
    def overhead_estimate_s(self) -> float:
        """The instrumentation's own time: timed regions x what one costs."""
        return self.breakdown.regions * self.region_cost_s

    def stage_attainable(self, stage: str, kernel: str | None = None) -> Attainable | None:
        """The attainable speed of the linear calls made in ``stage`` (of ``kernel``'s kind
        only, where given: linears or LM head); None where it made none."""
        calls = Counter()
        for (name, shape, rows), n in self.breakdown.census.items():
            if name == stage and kernel in (None, shape.kernel):
                calls[shape, rows] += n
        return attainable(calls, self.timings) if calls else None


def step_passes(shape: TreeShape, batch: int) -> dict[str, tuple[int, ...]]:
    """Rows of each pass of one full step: the draft's context pass (each row's newest token)
    and one pass per tree level that has children, the target's tree pass over the newest token
    and the scored nodes; every linear layer, the LM head included, runs on all of a pass's rows
    (a prefill computes the LM head on its last row only: the run's census has those)."""
    frontiers = [
        sum(1 for n in shape.nodes_at_depth(d) if shape.children[n])
        for d in range(1, shape.max_depth + 1)
    ]
    scored = sum(1 for n in range(len(shape)) if shape.children[n])
    return {
        "draft": (batch,) + tuple(batch * f for f in frontiers if f),
        "target": (batch * (1 + scored),),
    }


def step_calls(passes: dict[str, tuple[int, ...]], counts: Counter) -> Counter:
    """(shape, rows) -> calls of one full step: each pass calls every linear layer once."""
    calls = Counter()
    for shape, n in counts.items():
        for rows in passes[shape.role]:
            calls[shape, rows] += n
    return calls


def timed_run(
    config: RunConfig, out: Path, pair: ModelPair, batch: int, clock
) -> tuple[int, float]:
    """(nodes, wall seconds) of one measurement, the device synchronised around it."""
    clock.sync()
    t0 = time.perf_counter()
    summary = run_study(config, out, progress=False, pair=pair, batch_size=batch)
    clock.sync()
    return summary.nodes, time.perf_counter() - t0


def records_identical(a: Path, b: Path) -> bool:
    """Whether two runs' node, step and prompt records are equal, timing columns aside."""
    ra, rb = load_run(a), load_run(b)
    for name in ("nodes", "steps", "prompts"):
        ta, tb = (
            getattr(r, name).drop(columns=[c for c in TIMING_COLUMNS if c in getattr(r, name)])
            for r in (ra, rb)
        )
        if not ta.equals(tb):
            return False
    return True


def measure_cell(
    pair: ModelPair,
    config: RunConfig,
    dtype: str,
    batch: int,
    work: Path,
    min_seconds: float,
    warmup: bool = True,
) -> Cell:
    """Run one cell: a short untimed warm-up (the same prompts, 2 new tokens: every prefill
    and full-batch shape runs once), plain, instrumented, then the attainable timings of the
    shapes it ran."""
    clock = clock_for(pair.target.device)
    models = pair_models(pair)
    if warmup:
        short = replace(config, max_new_tokens=min(2, config.max_new_tokens))
        timed_run(short, work / "warmup", pair, batch, clock)
    nodes, plain_s = timed_run(config, work / "plain", pair, batch, clock)
    with instrumented(models, clock) as recorder:
        _, instrumented_s = timed_run(config, work / "instrumented", pair, batch, clock)
    breakdown = recorder.breakdown(instrumented_s)
    run_calls = Counter()
    for (_, shape, rows), n in breakdown.census.items():
        run_calls[shape, rows] += n
    passes = step_passes(config.tree.shape(), batch)
    full_step = step_calls(passes, shape_counts(models))
    keys = set(run_calls) | set(full_step)
    hot = time_shapes(keys, shape_modules(models), clock, min_seconds)
    # on a CPU, the attainable speed is a pass's: each layer's weights read from memory (a GPU's
    # per-call synchronisation would time launches, not kernels: there the shapes alone)
    cpu = pair.target.device.type == "cpu"
    timings = time_shapes_streamed(keys, models, clock, min_seconds) if cpu else hot
    return Cell(
        dtype,
        batch,
        nodes,
        plain_s,
        instrumented_s,
        records_identical(work / "plain", work / "instrumented"),
        breakdown,
        timings,
        attainable(run_calls, timings),
        attainable(full_step, timings),
        passes,
        region_overhead_s(clock),
        attainable(run_calls, hot),
    )


# --- reporting ------------------------------------------------------------------------------------------


def _gops(x: float) -> str:
    return f"{x:,.1f}" if x == x else "-"


def stage_lines(cell: Cell) -> list[str]:
    """The stage table: seconds and share of the instrumented wall; for linear work its GOP/s
    beside the attainable GOP/s of the same calls."""
    b, wall = cell.breakdown, cell.breakdown.wall_s
    lines = [
        "| stage | seconds | share of wall | calls | GOP/s | attainable GOP/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for stage in b.stages:
        name = stage.name or "(outside every stage)"
        att = cell.stage_attainable(stage.name)
        ops = sum(k.ops for k in stage.kernels)
        own = _gops(ops / stage.seconds / 1e9) if ops and stage.seconds > 0 else ""
        lines.append(
            f"| {name} | {stage.seconds:.3f} | {stage.seconds / wall:.1%} | {stage.calls} | {own} "
            f"| {_gops(att.gops) if att else ''} |"
        )
        for k in stage.kernels:
            att = cell.stage_attainable(stage.name, k.name) if k.ops else None
            lines.append(
                f"| - of which {k.name} | {k.seconds:.3f} | {k.seconds / wall:.1%} | {k.calls} "
                f"| {_gops(k.gops) if k.ops else ''} | {_gops(att.gops) if att else ''} |"
            )
        if stage.kernels and stage.name:
            rest = stage.seconds - stage.kernel_seconds
            lines.append(f"| - of which the rest | {rest:.3f} | {rest / wall:.1%} | | | |")
    lines.append(f"| Python/other (remainder) | {b.other_s:.3f} | {b.other_s / wall:.1%} | | | |")
    lines.append(f"| wall (instrumented) | {wall:.3f} | 100.0% | | | |")
    return lines


def shape_lines(cell: Cell) -> list[str]:
    """Attainable GOP/s per linear shape at one full step's rows."""
    lines = [
        "| model | shape (in x out) | rows | ms per call | GOP/s |",
        "|---|---|---:|---:|---:|",
    ]
    for (shape, rows), t in cell.timings.items():
        if rows not in cell.step_rows[shape.role]:
            continue
        head = " (LM head)" if shape.head else ""
        lines.append(
            f"| {shape.role} | {shape.in_features} x {shape.out_features}{head} | {rows} "
            f"| {t.seconds * 1e3:.3f} | {_gops(t.gops)} |"
        )
    return lines


def cell_lines(cell: Cell) -> list[str]:
    busy = (
        ["note: achieved above attainable: the shapes' timings were slowed (a busy machine?)"]
        if cell.ratio > 1
        else []
    )
    return [
        f"{cell.dtype} B={cell.batch}: {cell.nodes} nodes in {cell.plain_s:.2f} s = "
        f"{cell.nodes / cell.plain_s:.2f} nodes/s; instrumented {cell.instrumented_s:.2f} s "
        f"({cell.overhead:+.1%}); records identical: {cell.records_identical}",
        f"instrumentation: {cell.breakdown.regions} timed regions x "
        f"{cell.region_cost_s * 1e6:.1f} us = {cell.overhead_estimate_s:.3f} s "
        f"({cell.overhead_estimate_s / cell.plain_s:.1%} of the plain wall)",
        f"linear work {cell.breakdown.ops / 1e9:,.1f} GOP: achieved {_gops(cell.achieved_gops)} "
        f"GOP/s, attainable {_gops(cell.run.gops)} GOP/s (the same calls, timed as passes run "
        f"them) -> achieved/attainable {cell.ratio:.1%}; each shape alone, its weights in the "
        f"caches: {_gops(cell.hot.gops)} GOP/s -> {cell.hot_ratio:.1%}; one full step at "
        f"B={cell.batch}: attainable {_gops(cell.step.gops)} GOP/s",
        *busy,
        "",
        *shape_lines(cell),
        "",
        *stage_lines(cell),
        "",
    ]


def summary_lines(cells: list[Cell]) -> list[str]:
    lines = [
        "| dtype | batch | nodes/s | achieved GOP/s | attainable GOP/s | achieved/attainable "
        "| weights in cache: GOP/s, ratio | step attainable GOP/s | overhead: wall, estimated | records identical | "
        + " | ".join(f"{s} %" for s in STAGES)
        + " | other % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|" + "---:|" * (len(STAGES) + 1),
    ]
    for c in cells:
        shares = [
            f"{(s.seconds if (s := c.breakdown.stage(name)) else 0) / c.breakdown.wall_s:.1%}"
            for name in STAGES
        ]
        lines.append(
            f"| {c.dtype} | {c.batch} | {c.nodes / c.plain_s:.2f} | {_gops(c.achieved_gops)} "
            f"| {_gops(c.run.gops)} | {c.ratio:.1%} | {_gops(c.hot.gops)}, {c.hot_ratio:.1%} "
            f"| {_gops(c.step.gops)} | {c.overhead:+.1%}, "
            f"{c.overhead_estimate_s / c.plain_s:.1%} "
            f"| {'yes' if c.records_identical else 'NO'} | "
            + " | ".join(shares)
            + f" | {c.breakdown.other_s / c.breakdown.wall_s:.1%} |"
        )
    return lines


def cell_dict(cell: Cell) -> dict:
    """Every figure of a cell, JSON-ready."""
    b = cell.breakdown
    return {
        "dtype": cell.dtype,
        "batch": cell.batch,
        "nodes": cell.nodes,
        "plain_s": cell.plain_s,
        "nodes_per_s": cell.nodes / cell.plain_s,
        "instrumented_s": cell.instrumented_s,
        "overhead": cell.overhead,
        "timed_regions": b.regions,
        "region_cost_s": cell.region_cost_s,
        "overhead_estimate_s": cell.overhead_estimate_s,
        "records_identical": cell.records_identical,
        "linear_ops": b.ops,
        "achieved_gops": cell.achieved_gops,
        "attainable_gops": cell.run.gops,
        "achieved_over_attainable": cell.ratio,
        "hot_attainable_gops": cell.hot.gops,
        "achieved_over_hot_attainable": cell.hot_ratio,
        "step_attainable_gops": cell.step.gops,
        "step_rows": cell.step_rows,
        "other_s": b.other_s,
        "stages": [
            {
                **asdict(s),
                "attainable_gops": (a.gops if (a := cell.stage_attainable(s.name)) else None),
                "kernel_attainable_gops": {
                    k.name: a.gops
                    for k in s.kernels
                    if k.ops and (a := cell.stage_attainable(s.name, k.name))
                },
            }
            for s in b.stages
        ],
        "timings": [
            {**asdict(t.shape), "rows": t.rows, "seconds": t.seconds, "gops": t.gops}
            for t in cell.timings.values()
        ],
    }


def machine() -> dict:
    return {
        "hardware": asdict(hardware()),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "commit": git_commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# --- main ---------------------------------------------------------------------------------------------


def run_config(args, config: PairConfig) -> RunConfig:
    tree = (
        TreeConfig(policy="static", paths=args.paths) if args.paths else TreeConfig(policy="paper")
    )
    prompts = (
        PromptSpec(file=args.prompts)
        if args.prompts
        else PromptSpec(domains=DOMAINS, per_domain=args.per_domain)
    )
    return RunConfig(pair=config, tree=tree, prompts=prompts, max_new_tokens=args.max_new_tokens)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=PAIR_KINDS, default="demo")
    parser.add_argument("--dtypes", "--dtype", nargs="+", choices=DTYPES, default=["bfloat16"])
    parser.add_argument("--sizes", "--batch-size", type=int, nargs="+", default=[8])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--per-domain", type=int, default=2)
    parser.add_argument("--prompts", help="a JSONL prompts file instead of the offline sources")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--paths", help="a static tree's paths instead of the paper tree")
    parser.add_argument(
        "--min-seconds", type=float, default=0.05, help="least time spent timing each shape"
    )
    parser.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip the untimed warm-up run (2 new tokens) before each cell",
    )
    parser.add_argument("--out", type=Path, help="write every figure to this JSON file")
    return parser.parse_args(argv)


def bench(args: argparse.Namespace, work: Path) -> list[Cell]:
    """Every (dtype, batch size) cell, one pair loaded at a time; each cell printed when done."""
    configs = {dtype: pair_config(args.pair, dtype, args.device) for dtype in args.dtypes}
    reproducible_on(args.device)  # as load_pair does: on a GPU the same records on every run
    cells = []
    for dtype, config in configs.items():
        pair = build_pair(args.pair, config)
        run = run_config(args, config)
        for size in args.sizes:
            cell = measure_cell(
                pair, run, dtype, size, work / f"{dtype}-{size}", args.min_seconds, args.warmup
            )
            print("\n".join(cell_lines(cell)), flush=True)
            cells.append(cell)
        del pair
        gc.collect()
    return cells


def main(argv: list[str] | None = None) -> list[Cell]:
    args = parse(argv)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cells = bench(args, Path(tmp))
    except SpecscopeError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print("\n".join(summary_lines(cells)))
    if args.out:
        report = {
            "machine": machine(),
            "pair": args.pair,
            "device": args.device,
            "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "cells": [cell_dict(c) for c in cells],
        }
        args.out.write_text(json.dumps(report, indent=2))
    return cells


if __name__ == "__main__":
    main()
