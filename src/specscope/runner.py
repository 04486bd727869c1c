"""A measurement run: config, prompt loop, resumable records (README: "What a run measures", "Records").

``run_study(config, out_dir)`` loads the pair, measures every prompt with the paper protocol and
commits its records before starting the next; re-running the same command resumes an interrupted
run and does nothing for a finished one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import subprocess
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata, resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from . import __version__
from .errors import SpecscopeError
from .domains import SMOKE_PROMPTS, PromptItem, PromptSourceError, read_jsonl, sample_items
from .engine import ENGINES, make_engine, step_record
from .fingerprint import prompt_sha256
from .models import ModelPair, PairConfig, load_pair, model_identity, use_rowwise_attention
from .theory import CriteriaConfig, node_certificate_columns, step_criteria_columns
from .records import (SCHEMA_VERSION, RunWriter, check_writable_dir, position_bin,
                      read_manifest, remove_run, to_table, write_json_atomic)
from .trees import TreeConfig, TreeShape
from .validate import check_fields

PRESETS = ("paper", "demo")


class RunConfigError(SpecscopeError, ValueError):
    """A run config that cannot be used; the message names the field and what is allowed."""


@dataclass(frozen=True)
class PromptSpec:
    """Which prompts to measure: a JSONL file, the built-in smoke set, or domain sources."""

    file: str | None = None
    domains: tuple[str, ...] = ()
    per_domain: int | None = None
    sources: tuple[tuple[str, str], ...] = ()  # (domain, source name) overrides
    smoke: bool = False

    def select(self, seed: int) -> list[PromptItem]:
        if self.smoke:
            return list(SMOKE_PROMPTS)
        if self.file:
            domain = self.domains[0] if len(self.domains) == 1 else None
            items = read_jsonl(self.file, domain=domain)
            if self.per_domain is None:
                return items
            by_domain: dict[str, list[PromptItem]] = {}
            for item in items:
                by_domain.setdefault(item.domain, []).append(item)
            return [x for group in by_domain.values()
                    for x in sample_items(group, self.per_domain, seed)]
        if self.domains:
            from .domains import select_prompts

            return select_prompts(list(self.domains), self.per_domain, seed=seed,
                                  sources=dict(self.sources) or None)
        raise PromptSourceError("no prompts: give --prompts FILE, --domains or --smoke")


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's records."""

    pair: PairConfig = field(default_factory=PairConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    prompts: PromptSpec = field(default_factory=PromptSpec)
    engine: str = "cached"
    max_new_tokens: int = 64
    max_prompt_tokens: int = 512
    chat_template: bool = True
    seed: int = 42
    criteria: CriteriaConfig | None = field(default_factory=CriteriaConfig)  # None: no certificates

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise RunConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if self.max_new_tokens < 1:
            raise RunConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_prompt_tokens < 1:
            raise RunConfigError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def run_id(self) -> str:
        """A content hash of the config: the same config always gives the same id."""
        text = json.dumps(self.to_dict(), sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        """A config from TOML- or JSON-like data; every value's type is checked, by field."""
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise RunConfigError(f"unknown config keys {sorted(unknown)}; allowed: {sorted(known)}")
        check_fields(cls, data, RunConfigError)
        try:
            if isinstance(data.get("criteria"), dict):
                data["criteria"] = CriteriaConfig.from_dict(data["criteria"])
        except (TypeError, ValueError) as e:
            if isinstance(e, SpecscopeError):
                raise
            raise RunConfigError(f"criteria: {e}") from None
        nested = {"pair": PairConfig, "tree": TreeConfig, "prompts": PromptSpec}
        for key, kind in nested.items():
            if key in data:
                if not isinstance(data[key], dict):
                    raise RunConfigError(f"[{key}] must be a table, got {data[key]!r}")
                section = dict(data[key])
                allowed = {f.name for f in dataclasses.fields(kind)}
                if set(section) - allowed:
                    raise RunConfigError(f"unknown keys {sorted(set(section) - allowed)} in "
                                         f"[{key}]; allowed: {sorted(allowed)}")
                check_fields(kind, section, RunConfigError, f"{key}.")
                for name in ("domains", "sources"):
                    if name in section and section[name] is not None:
                        section[name] = tuple(tuple(x) if isinstance(x, list) else x
                                              for x in section[name])
                data[key] = kind(**section)
        return cls(**data)

    def replace(self, **overrides) -> RunConfig:
        """A copy with top-level or ``section.key`` overrides (None values are ignored)."""
        data = self.to_dict()
        for key, value in overrides.items():
            if value is None:
                continue
            section, _, name = key.rpartition(".")
            (data[section] if section else data)[name] = value
        return RunConfig.from_dict(data)


def load_config(source: str | Path | None) -> RunConfig:
    """A config from a preset name (``paper``, ``demo``), a TOML file, a run's
    ``manifest.json`` (its recorded config, to measure more like it), or the defaults."""
    if source is None:
        return RunConfig()
    if str(source) in PRESETS:
        text = resources.files("specscope").joinpath("presets", f"{source}.toml").read_text()
    else:
        path = Path(source)
        if not path.is_file():
            raise RunConfigError(f"config {source} is neither a preset ({', '.join(PRESETS)}) "
                                 "nor a TOML file or a run's manifest.json")
        text = path.read_text()
    try:
        if str(source).endswith(".json"):
            manifest = json.loads(text)
            if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
                raise RunConfigError(f"{source}: not a run manifest (it has no 'config' object)")
            return RunConfig.from_dict(manifest["config"])
        return RunConfig.from_dict(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise RunConfigError(f"{source}: invalid {'JSON' if str(source).endswith('.json') else 'TOML'}: {e}") from None
    except TypeError as e:
        raise RunConfigError(f"{source}: {e}") from None


# --- one prompt ---------------------------------------------------------------------------------


@dataclass
class RenderedPrompt:
    text: str
    ids: list[int]
    truncated: bool


def render_prompt(tokenizer, messages, chat_template: bool, max_tokens: int) -> RenderedPrompt:
    """Apply the chat template (or join the turns), tokenise, keep the last ``max_tokens``."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        text = "\n\n".join(str(m["content"]) for m in messages)
        ids = tokenizer(text)["input_ids"]
    return RenderedPrompt(text, ids[-max_tokens:], len(ids) > max_tokens)


def eos_token_ids(pair: ModelPair) -> set[int]:
    ids = set()
    for value in (pair.tokenizer.eos_token_id,
                  getattr(pair.target.model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return ids


def context_certificates(scores, shape: TreeShape, criteria: CriteriaConfig) -> dict[str, np.ndarray]:
    """Each node's certificates at its context, computed once per distinct context."""
    contexts, index = np.unique(np.asarray(shape.parents) + 1, return_inverse=True)
    columns = node_certificate_columns(scores.p[torch.as_tensor(contexts)], criteria)
    return {name: values[index] for name, values in columns.items()}


@dataclass
class PromptRecords:
    nodes: pa.Table
    steps: pa.Table
    prompt: pa.Table


@dataclass
class PromptState:
    """One prompt being measured: its context grows by the target's greedy token each step."""

    item: PromptItem
    order: int
    rendered: RenderedPrompt
    context: list[int]
    t_start: float
    node_cols: list[dict[str, np.ndarray]] = field(default_factory=list)
    step_rows: list[dict] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"


def start_prompt(pair: ModelPair, item: PromptItem, config: RunConfig, order: int) -> PromptState:
    rendered = render_prompt(pair.tokenizer, item.messages, config.chat_template,
                             config.max_prompt_tokens)
    return PromptState(item, order, rendered, list(rendered.ids), time.perf_counter())


def record_step(state: PromptState, scores, shape: TreeShape, config: RunConfig, eos: set[int],
                step_time_s: float) -> bool:
    """Record one step's nodes and step row, append the target's greedy token; True when the
    prompt is finished (EOS or ``max_new_tokens``)."""
    step = len(state.step_rows)
    record = step_record(scores, shape)
    record.nodes["step"] = np.full(len(shape), step, dtype=np.int32)
    criteria = {}
    if config.criteria is not None:
        record.nodes.update(context_certificates(scores, shape, config.criteria))
        criteria = {k: v[0] for k, v in step_criteria_columns(
            scores.p[0], scores.q[0], config.criteria).items()
            if k not in ("kl_target_draft", "target_margin")}
    state.node_cols.append(record.nodes)
    state.step_rows.append({
        **criteria, "step": step, "context_len": len(state.context), "tree_size": len(shape),
        "emitted_token": record.emitted_token, "accepted_len": record.accepted_len,
        "tau": record.accepted_len + 1, "draft_time_s": scores.draft_time_s,
        "verify_time_s": scores.verify_time_s, "step_time_s": step_time_s,
    })
    state.context.append(record.emitted_token)
    state.output.append(record.emitted_token)
    if record.emitted_token in eos:
        state.stop_reason = "eos"
        return True
    return len(state.output) >= config.max_new_tokens


def finish_prompt(state: PromptState, pair: ModelPair, run_id: str) -> PromptRecords:
    """The node, step and prompt rows of a finished prompt."""
    item, n_steps = state.item, len(state.step_rows)

    def common(n: int) -> dict:
        return {"run_id": [run_id] * n, "prompt_id": [item.id] * n, "domain": [item.domain] * n}

    nodes = {k: np.concatenate([c[k] for c in state.node_cols]) for k in state.node_cols[0]}
    nodes["position_bin"] = position_bin(nodes["step"]).astype(np.int8)
    steps = {k: [r[k] for r in state.step_rows] for k in state.step_rows[0]}
    steps["position_bin"] = [position_bin(s) for s in steps["step"]]
    prompt = {
        "order": [state.order], "source": [item.source], "source_index": [item.source_index],
        "dataset": [item.dataset], "split": [item.split],
        "messages_json": [json.dumps(list(item.messages), ensure_ascii=False)],
        "prompt_text": [state.rendered.text], "prompt_tokens": [len(state.rendered.ids)],
        "truncated": [state.rendered.truncated], "generated_tokens": [len(state.output)],
        "output_token_ids": [state.output],
        "output_text": [pair.tokenizer.decode(state.output, skip_special_tokens=True)],
        "stop_reason": [state.stop_reason], "time_s": [time.perf_counter() - state.t_start],
    }
    return PromptRecords(
        nodes=to_table({**common(len(nodes["step"])), **nodes}, "nodes"),
        steps=to_table({**common(n_steps), **steps}, "steps"),
        prompt=to_table({**common(1), **prompt}, "prompts"),
    )


def measure_prompt(engine, pair: ModelPair, item: PromptItem, config: RunConfig,
                   shape: TreeShape, order: int, run_id: str) -> PromptRecords:
    """Run the paper protocol on one prompt and return its node, step and prompt rows."""
    state = start_prompt(pair, item, config, order)
    eos = eos_token_ids(pair)
    engine.reset(state.context)
    done = False
    while not done:
        t0 = time.perf_counter()
        scores = engine.score(state.context, shape)
        done = record_step(state, scores, shape, config, eos, 0.0)
        state.step_rows[-1]["step_time_s"] = time.perf_counter() - t0
    return finish_prompt(state, pair, run_id)


def measure_batched(pair: ModelPair, todo: list[tuple[int, PromptItem]], config: RunConfig,
                    shape: TreeShape, run_id: str, batch_size: int,
                    commit: Callable[[PromptState, PromptRecords], None]) -> None:
    """Measure ``todo`` ``batch_size`` prompts at a time (:mod:`specscope.batch`); each prompt is
    committed as soon as it finishes and its row is refilled. Prompts of similar length run
    together (longest first, so the first batch is the largest), which wastes little padding."""
    from .batch import BatchedEngine, Row

    eos = eos_token_ids(pair)
    pending = sorted((start_prompt(pair, item, config, order) for order, item in todo),
                     key=lambda s: -len(s.context))
    pending.reverse()  # pop() takes the longest first
    def join(count: int) -> list[Row]:  # the next prompts; their clocks start as they join
        states = [pending.pop() for _ in range(min(count, len(pending)))]
        for s in states:
            s.t_start = time.perf_counter()
        return [Row(s.context, s) for s in states]

    engine = BatchedEngine(pair.draft.model, pair.target.model, pair.vocab_size)
    engine.replace_rows([], join(batch_size))
    while engine.rows:
        t0 = time.perf_counter()
        scores = engine.score(shape)
        share = (time.perf_counter() - t0) / len(scores)
        finished = [i for i, (row, sc) in enumerate(zip(engine.rows, scores))
                    if record_step(row.payload, sc, shape, config, eos, share)]
        for i in finished:
            state = engine.rows[i].payload
            commit(state, finish_prompt(state, pair, run_id))
        if finished:
            keep = [i for i in range(len(engine.rows)) if i not in finished]
            engine.replace_rows(keep, join(len(finished)))


# --- a whole run --------------------------------------------------------------------------------


@dataclass
class RunSummary:
    run_dir: Path
    run_id: str
    prompts_total: int
    prompts_measured: int  # in this invocation
    prompts_skipped_empty: int
    nodes: int  # in this invocation
    seconds: float
    already_complete: bool = False


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("specscope", "torch", "transformers", "pyarrow", "numpy", "gguf"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _flatten(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def config_differences(manifest: dict, config: RunConfig) -> list[str]:
    """The ``section.key`` names in which ``config`` differs from a run manifest's config."""
    old = _flatten(RunConfig.from_dict(manifest["config"]).to_dict())
    return [key for key, value in _flatten(config.to_dict()).items() if old.get(key) != value]


def run_manifest(config: RunConfig, items: list[PromptItem], empty: list[str], models: dict,
                 created: str | None = None) -> dict:
    """The manifest of a run that is starting (status ``running``); ``models``: pair provenance."""
    shape = config.tree.shape()
    return {
        "schema_version": SCHEMA_VERSION,
        "specscope_version": __version__,
        "run_id": config.run_id,
        "status": "running",
        "created": created or _now(),
        "config": config.to_dict(),
        "tree": {"paths": shape.to_paths_literal(), "nodes_per_depth": list(shape.depth_counts())},
        "models": models,
        "packages": _package_versions(),
        "git_commit": git_commit(),
        "seed": config.seed,
        "prompts": {
            "count": len(items),
            "sources": sorted({item.source for item in items}),
            "ids": [item.id for item in items],
            "skipped_empty": empty,
        },
    }


@dataclass
class RunDirState:
    """What an output directory holds, checked before any model loads or anything is written."""

    manifest: dict | None  # the run to resume, if any
    replace: bool  # specscope's files there are removed before the first write


def prepare_run_dir(out_dir: Path, config: RunConfig, overwrite: bool) -> RunDirState:
    """Check ``out_dir`` before any expensive work. Nothing is deleted here.

    A directory that is not a specscope run is never touched (``--overwrite`` only replaces a
    run); a run with another config is refused unless ``overwrite``, or unless it never committed
    a prompt (a failed start loses nothing by being replaced).
    """
    check_writable_dir(out_dir)
    if not (out_dir / "manifest.json").is_file():
        if out_dir.exists() and any(out_dir.iterdir()):
            raise RunConfigError(f"{out_dir} exists and is not a specscope run (no manifest.json); "
                                 "choose an empty or new directory (--overwrite only replaces a "
                                 "specscope run)")
        return RunDirState(None, False)
    if overwrite:
        return RunDirState(None, True)
    manifest = read_manifest(out_dir)
    if manifest.get("run_id") != config.run_id:
        if not RunWriter(out_dir).done_prompt_ids():
            return RunDirState(None, True)
        diff = config_differences(manifest, config)
        raise RunConfigError(
            f"{out_dir} holds a run with a different config (differs in: {', '.join(diff)}); "
            "use another directory, or --overwrite to start over")
    return RunDirState(manifest, False)


def prompt_hashes(items: list[PromptItem]) -> dict[str, str]:
    return {item.id: prompt_sha256(item.messages) for item in items}


def check_identity(out_dir: Path, manifest: dict, hashes: dict[str, str],
                   models: dict[str, dict]) -> None:
    """Refuse to resume a run whose prompts or models changed since it started, naming them."""
    before = manifest.get("prompts", {}).get("sha256") or {}
    changed = sorted(pid for pid, h in hashes.items() if pid in before and before[pid] != h)
    if changed:
        raise RunConfigError(
            f"{out_dir}: the text of prompt(s) {', '.join(changed[:5])} changed since the run "
            "started (same id, other messages); use another directory, or --overwrite")
    for role, now in models.items():
        old = (manifest.get("models") or {}).get(role) or {}
        if old.get("fingerprint") and now.get("fingerprint") and old["fingerprint"] != now["fingerprint"]:
            raise RunConfigError(
                f"{out_dir}: the {role} model at {now['source']} changed since the run started "
                f"(weights fingerprint {old['fingerprint'][:12]}... now {now['fingerprint'][:12]}...); "
                "use another directory, or --overwrite")


def check_tree_fits(shape: TreeShape, vocab: int) -> None:
    if max(shape.ranks) >= vocab:
        raise RunConfigError(f"the tree asks for the draft's token of rank {max(shape.ranks)}, but "
                             f"the vocabulary has {vocab} tokens (ranks 0 to {vocab - 1})")


def default_batch_size(config: RunConfig) -> int:
    """Prompts measured together by default: 1 for the naive engine (it cannot batch), 32 on a
    GPU, else 8 (the fastest on a 2-core CPU; BENCHMARKS.md)."""
    if config.engine != "cached":
        return 1
    return 32 if config.pair.device.startswith("cuda") else 8


def run_study(config: RunConfig, out_dir: str | Path, overwrite: bool = False,
              progress: bool = True, pair: ModelPair | None = None,
              batch_size: int = 1) -> RunSummary:
    """Measure every selected prompt into ``out_dir``, resuming what an earlier call left.

    ``batch_size`` > 1 measures that many prompts together (cached engine only); it changes how
    fast, not what: it is not part of the run's identity.
    """
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    out_dir = Path(out_dir)
    t_start = time.perf_counter()
    console = Console(stderr=True)
    # Every input is checked before a model loads or a file is written or removed.
    shape = config.tree.shape()
    items = config.prompts.select(config.seed)
    empty = [item.id for item in items if item.is_empty]
    items = [item for item in items if not item.is_empty]
    if batch_size < 1:
        raise RunConfigError(f"batch size must be >= 1, got {batch_size}")
    if batch_size > 1 and config.engine != "cached":
        raise RunConfigError(f"--batch-size {batch_size} needs the cached engine; the naive "
                             "engine (the paper's algorithm) measures one prompt at a time")
    state = prepare_run_dir(out_dir, config, overwrite)
    existing = state.manifest
    hashes = prompt_hashes(items)
    if existing is not None:
        check_identity(out_dir, existing, hashes,
                       {"draft": model_identity(config.pair.draft),
                        "target": model_identity(config.pair.target)})
    writer = RunWriter(out_dir)
    done = set() if state.replace else writer.done_prompt_ids()
    todo = [(order, item) for order, item in enumerate(items) if item.id not in done]
    run_id = config.run_id
    if not todo and existing and existing.get("status") == "complete":
        if writer.damaged(existing.get("counts") or {}):
            existing.update(counts=writer.consolidate())
            write_json_atomic(existing, out_dir / "manifest.json")
            console.print(f"[yellow]{out_dir}: rebuilt damaged consolidated records from parts/")
        return RunSummary(out_dir, run_id, len(items), 0, len(empty), 0,
                          time.perf_counter() - t_start, already_complete=True)

    pair = pair or load_pair(config.pair)
    if config.pair.quantize == "int8":
        # measurement records the draft's q too: make it batch-invariant like the target, so
        # that records do not depend on the batch size (decoding leaves the draft on SDPA)
        use_rowwise_attention(pair.draft.model)
    check_tree_fits(shape, pair.vocab_size)
    if batch_size > 1:
        from .batch import check_batch_memory

        check_batch_memory(pair, batch_size, config.max_prompt_tokens + config.max_new_tokens,
                           len(shape))
    if state.replace:
        remove_run(out_dir)
    manifest = run_manifest(config, items, empty, pair.provenance, (existing or {}).get("created"))
    manifest["prompts"]["sha256"] = hashes
    manifest["execution"] = {"batch_size": batch_size, "torch_threads": torch.get_num_threads()}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(manifest, out_dir / "manifest.json")
    if empty:
        console.print(f"[yellow]skipped {len(empty)} empty prompt(s): {', '.join(empty)}")

    torch.manual_seed(config.seed)
    nodes_total = 0
    t_loop = time.perf_counter()
    with Progress(TextColumn("[bold]measuring"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("prompts  {task.fields[nodes]} nodes  {task.fields[rate]} nodes/s"),
                  TimeElapsedColumn(), console=console, disable=not progress) as bar:
        task = bar.add_task("run", total=len(items), completed=len(items) - len(todo),
                            nodes=0, rate="-")

        def commit(order: int, item: PromptItem, records: PromptRecords) -> None:
            nonlocal nodes_total
            writer.commit_prompt(order, item.id, records.nodes, records.steps, records.prompt)
            nodes_total += records.nodes.num_rows
            rate = nodes_total / (time.perf_counter() - t_loop)
            bar.update(task, advance=1, nodes=nodes_total, rate=f"{rate:.1f}")

        if batch_size > 1:
            measure_batched(pair, todo, config, shape, run_id, batch_size,
                            lambda state, records: commit(state.order, state.item, records))
        else:
            engine = make_engine(config.engine, pair.draft.model, pair.target.model,
                                 pair.vocab_size)
            for order, item in todo:
                commit(order, item, measure_prompt(engine, pair, item, config, shape, order,
                                                   run_id))

    counts = writer.consolidate()
    seconds = time.perf_counter() - t_start
    manifest.update(status="complete", finished=_now(), counts=counts,
                    timings={"last_invocation_s": round(seconds, 3),
                             "nodes_per_s": round(nodes_total / max(seconds, 1e-9), 3)})
    write_json_atomic(manifest, out_dir / "manifest.json")
    return RunSummary(out_dir, run_id, len(items), len(todo), len(empty), nodes_total, seconds)
