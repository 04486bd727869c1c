"""``specscope run``: measure every selected prompt into a run directory, resuming what an earlier
call left, refusing what would mix two configs, and never deleting what is not a run.

A run holds its directory's lock (:func:`specscope.records.run_lock`) from its first look at the
directory to its last write: a second run on a live directory is refused, never replaced.

The measuring itself is :func:`specscope.measure.study.measure_prompts`, shared with the sweep.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..measure.checks import check_batch_memory, check_batch_size
from ..measure.study import PromptRecords, PromptState, measure_prompts, start_prompts
from ..models import ModelPair, load_pair, model_identity
from ..progress import Progress, Tally, observer
from ..prompts.items import PromptItem
from ..records import (
    RunDir,
    check_writable_dir,
    is_lock_file,
    read_manifest,
    remove_run,
    run_lock,
)
from .config import RunConfig, RunConfigError
from .manifest import (
    check_identity,
    config_differences,
    machines_with_this,
    now_utc,
    prompt_hashes,
    run_manifest,
)


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


@dataclass
class RunDirState:
    """What an output directory holds, checked before any model loads or anything is written."""

    manifest: dict | None  # the run to resume, if any
    replace: bool  # specscope's files there are removed before the first write


def prepare_run_dir(out_dir: Path, config: RunConfig, overwrite: bool) -> RunDirState:
    """Check ``out_dir`` before any expensive work. Nothing is deleted here.

    A directory that is not a specscope run is never touched (``--overwrite`` only replaces a
    run); a run with another config is refused unless ``overwrite``, or unless it never committed
    a prompt (a failed start loses nothing by being replaced). The caller holds the directory's
    lock (:func:`run_lock`), so a run found here has no live writer.
    """
    if not (out_dir / "manifest.json").is_file():
        if out_dir.exists() and any(not is_lock_file(p.name) for p in out_dir.iterdir()):
            raise RunConfigError(
                f"{out_dir} exists and is not a specscope run (no manifest.json); "
                "choose an empty or new directory (--overwrite only replaces a "
                "specscope run)"
            )
        return RunDirState(None, False)
    if overwrite:
        return RunDirState(None, True)
    manifest = read_manifest(out_dir)
    if manifest.get("run_id") != config.run_id:
        if not RunDir(out_dir).done_prompt_ids():
            return RunDirState(None, True)
        diff = config_differences(manifest, config)
        raise RunConfigError(
            f"{out_dir} holds a run with a different config (differs in: {', '.join(diff)}); "
            "use another directory, or --overwrite to start over"
        )
    return RunDirState(manifest, False)


def check_prompt_ids(items: list[PromptItem]) -> None:
    """Refuse, before anything is measured, a prompt id that records cannot hold (text that is
    not Unicode, such as a lone surrogate from a JSON escape); any other id, however long, is
    stored (its part's file name is hashed where needed)."""
    for item in items:
        try:
            item.id.encode("utf-8")
        except UnicodeEncodeError:
            raise RunConfigError(
                f"prompt id {item.id!r} ({item.source}) is not valid Unicode "
                "text; give the prompt another id"
            ) from None


def _measure(
    pair: ModelPair,
    config: RunConfig,
    states: list[PromptState],
    writer: RunDir,
    progress: Progress,
    done: int,
    total: int,
    batch_size: int,
) -> int:
    """Measure the prompts ``states`` start and commit each as it is done, telling ``progress``
    (``done`` of ``total`` prompts were committed before); the nodes recorded."""
    t_loop, measured, nodes = time.perf_counter(), 0, 0

    def tally() -> Tally:
        return Tally(done + measured, total, measured, nodes, time.perf_counter() - t_loop)

    def commit(order: int, item: PromptItem, records: PromptRecords) -> None:
        nonlocal measured, nodes
        writer.commit_prompt(order, item.id, records.nodes, records.steps, records.prompt)
        measured, nodes = measured + 1, nodes + records.nodes.num_rows
        progress.update(tally())

    progress.start("measuring", "prompts", tally())
    try:
        measure_prompts(pair, config, states, config.run_id, commit, batch_size)
    finally:
        progress.stop()
    return nodes


def run_study(
    config: RunConfig,
    out_dir: str | Path,
    overwrite: bool = False,
    progress: Progress | None = None,
    pair: ModelPair | None = None,
    batch_size: int = 1,
) -> RunSummary:
    """Measure every selected prompt into ``out_dir``, resuming what an earlier call left.

    ``batch_size`` prompts are measured together (> 1: the cached engine only;
    :func:`~specscope.measure.checks.default_batch_size` is the command line's default); it
    changes how fast, not what: it is not part of the run's identity. ``progress`` observes the
    measuring (:mod:`specscope.progress`; none: silent).
    """
    out_dir = Path(out_dir)
    t_start = time.perf_counter()
    progress = observer(progress)
    # Every input is checked before a model loads or a file is written or removed.
    shape = config.tree.shape()
    items = config.prompts.select(config.seed)
    empty = [item.id for item in items if item.is_empty]
    items = [item for item in items if not item.is_empty]
    check_prompt_ids(items)
    check_batch_size(config, batch_size)
    check_writable_dir(out_dir)
    with run_lock(out_dir):  # held until the last write
        state = prepare_run_dir(out_dir, config, overwrite)
        existing = state.manifest
        hashes = prompt_hashes(items)
        if existing is not None:
            check_identity(
                out_dir,
                existing,
                hashes,
                {
                    "draft": model_identity(config.pair.draft, config.pair.draft_revision),
                    "target": model_identity(config.pair.target, config.pair.target_revision),
                },
            )
        writer = RunDir(out_dir)
        done = set() if state.replace else writer.done_prompt_ids()
        todo = [(order, item) for order, item in enumerate(items) if item.id not in done]
        run_id = config.run_id
        if not todo and existing and existing.get("status") == "complete":
            if writer.damaged(existing.get("counts") or {}):
                existing.update(counts=writer.consolidate())
                writer.write_manifest(existing)
                progress.note(
                    f"{out_dir}: rebuilt damaged consolidated records from parts/", "warning"
                )
            return RunSummary(
                out_dir,
                run_id,
                len(items),
                0,
                len(empty),
                0,
                time.perf_counter() - t_start,
                already_complete=True,
            )

        pair = pair or load_pair(config.pair, config.drafter)
        shape.check_fits(pair.vocab_size)
        states = start_prompts(pair, config, todo)
        check_batch_memory(
            pair, batch_size, config.max_prompt_tokens + config.max_new_tokens, len(shape)
        )
        if state.replace:
            remove_run(out_dir)
        manifest = run_manifest(
            config, items, empty, pair.provenance, (existing or {}).get("created")
        )
        manifest["prompts"]["sha256"] = hashes
        manifest["execution"] = {"batch_size": batch_size, "torch_threads": torch.get_num_threads()}
        before = (existing or {}).get("machines") or []
        manifest["machines"] = machines_with_this(existing)
        if before and len(manifest["machines"]) > len(before):
            progress.note(
                f"{out_dir}: resumed on another machine than its records so far "
                f"({len(manifest['machines'])} in manifest.json's machines): floating-point "
                "rounding can differ between them",
                "warning",
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        writer.write_manifest(manifest)
        if empty:
            progress.note(f"skipped {len(empty)} empty prompt(s): {', '.join(empty)}", "warning")
        nodes_total = _measure(
            pair, config, states, writer, progress, len(items) - len(todo), len(items), batch_size
        )

        counts = writer.consolidate()
        seconds = time.perf_counter() - t_start
        manifest.update(
            status="complete",
            finished=now_utc(),
            counts=counts,
            timings={
                "last_invocation_s": round(seconds, 3),
                "nodes_per_s": round(nodes_total / max(seconds, 1e-9), 3),
            },
        )
        writer.write_manifest(manifest)
        return RunSummary(out_dir, run_id, len(items), len(todo), len(empty), nodes_total, seconds)
