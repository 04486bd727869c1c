"""Import the per-request speculation statistics that serving engines already emit.

``specscope ingest LOG --format F --prompts PROMPTS.jsonl --out DIR`` reads one JSON object per
line, joins each request to its prompt and domain (by ``prompt_id`` when the line carries one,
else by the engine's request id) and writes an *ingested run*: ``manifest.json`` (``kind:
ingested``), ``requests.parquet`` (one row per request) and, where the engine logged every verify
step, ``steps.parquet``. ``specscope analyze`` reads it (:mod:`specscope.analysis.stepwise`).

Formats (:data:`FORMATS`), each as the engine documents it:

- ``vllm``: an OpenAI-API response (or its ``data`` envelope) with ``metrics.speculative_decoding``
  from ``--per-request-spec-decode-metrics``: ``num_spec_steps``, ``num_accepted_draft_tokens``,
  ``num_draft_tokens``; ``detailed`` adds ``per_step_accepted`` and ``per_step_drafted``.
- ``sglang``: a ``/generate`` response with ``meta_info``: ``spec_verify_ct`` and
  ``completion_tokens`` (accepted drafts = completion tokens - 1 - verify steps: one token from the
  prefill, one from the target at every verify step).
- ``llama.cpp``: a llama-server response with ``timings``: ``draft_n``, ``draft_n_accepted``,
  ``predicted_n`` and, where the server reports it, ``draft_n_verif_steps``.
- ``spec-bench``: a Spec-Bench answer line: ``question_id`` and ``choices[].accept_lengths``
  (tokens per step, the target's own token included).

Node-level figures (alpha, entropies, trees) cannot come from these logs and are not invented.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from .prompts.items import PromptSourceError, jsonl_objects, read_jsonl
from .errors import SpecscopeError
from .records import check_writable_dir
from .tune.router import prompt_text

INGEST_FORMAT = "specscope-ingested/1"


class IngestError(SpecscopeError, ValueError):
    """A log line or prompt file that cannot be ingested; the message names the field."""


@dataclass(frozen=True)
class RequestStats:
    """One request's speculation, as an engine logged it."""

    request_id: str
    steps: int  # verify steps
    accepted: int  # draft tokens accepted over those steps
    drafted: int | None = None  # draft tokens proposed (None: not logged)
    generated: int | None = None  # tokens generated
    per_step_accepted: tuple[int, ...] | None = None
    per_step_drafted: tuple[int, ...] | None = None


def _field(obj: dict, key: str, where: str, kind=int):
    if key not in obj:
        raise IngestError(f"{where}: missing field {key!r}")
    value = obj[key]
    if kind is int and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        raise IngestError(f"{where}: field {key!r} must be a non-negative integer, got {value!r}")
    if kind is list and not (isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise IngestError(f"{where}: field {key!r} must be a list of non-negative integers")
    return value


def _section(line: dict, key: str, where: str, what: str) -> dict:
    value = line.get(key)
    if not isinstance(value, dict):
        raise IngestError(f"{where}: no {key} ({what})")
    return value


def _vllm(line: dict, where: str) -> RequestStats:
    body = line.get("data", line) if isinstance(line.get("data"), dict) else line
    spec = (body.get("metrics") or {}).get("speculative_decoding")
    if not isinstance(spec, dict):
        raise IngestError(f"{where}: no metrics.speculative_decoding (start vLLM with "
                          "--per-request-spec-decode-metrics summary or detailed)")
    where = f"{where}: metrics.speculative_decoding"
    steps = _field(spec, "num_spec_steps", where)
    accepted = _field(spec, "num_accepted_draft_tokens", where)
    drafted = _field(spec, "num_draft_tokens", where)
    per_acc = per_draft = None
    if "per_step_accepted" in spec or "per_step_drafted" in spec:
        per_acc = tuple(_field(spec, "per_step_accepted", where, list))
        per_draft = tuple(_field(spec, "per_step_drafted", where, list))
        if not len(per_acc) == len(per_draft) == steps:
            raise IngestError(f"{where}: per_step_accepted ({len(per_acc)}) and per_step_drafted "
                              f"({len(per_draft)}) must have num_spec_steps ({steps}) entries")
        if sum(per_acc) != accepted or any(a > d for a, d in zip(per_acc, per_draft)):
            raise IngestError(f"{where}: per_step_accepted must sum to num_accepted_draft_tokens "
                              "and never exceed per_step_drafted")
    usage = body.get("usage") or {}
    return RequestStats(str(body.get("id", "")), steps, accepted, drafted,
                        usage.get("completion_tokens"), per_acc, per_draft)


def _sglang(line: dict, where: str) -> RequestStats:
    meta = _section(line, "meta_info", where, "an SGLang /generate response")
    where = f"{where}: meta_info"
    steps = _field(meta, "spec_verify_ct", where)
    generated = _field(meta, "completion_tokens", where)
    accepted = generated - 1 - steps
    if steps and accepted < 0:
        raise IngestError(f"{where}: completion_tokens ({generated}) is less than "
                          f"spec_verify_ct + 1 ({steps + 1})")
    return RequestStats(str(meta.get("id", "")), steps, max(accepted, 0), None, generated)


def _llamacpp(line: dict, where: str) -> RequestStats:
    timings = _section(line, "timings", where, "a llama-server completion response")
    where = f"{where}: timings"
    drafted = _field(timings, "draft_n", where)
    accepted = _field(timings, "draft_n_accepted", where)
    generated = _field(timings, "predicted_n", where)
    if "draft_n_verif_steps" in timings:
        steps = _field(timings, "draft_n_verif_steps", where)
    else:  # every token after the first comes from a verify step: its accepted drafts + 1
        steps = generated - 1 - accepted
    if accepted > drafted or steps < 0:
        raise IngestError(f"{where}: draft_n_accepted ({accepted}) exceeds draft_n ({drafted}) "
                          f"or predicted_n ({generated})")
    return RequestStats(str(line.get("id", line.get("id_slot", ""))), steps, accepted, drafted,
                        generated)


def _spec_bench(line: dict, where: str) -> RequestStats:
    choices = line.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise IngestError(f"{where}: no choices (a Spec-Bench answer line)")
    lengths = choices[0].get("accept_lengths")
    flat = [x for turn in lengths for x in (turn if isinstance(turn, list) else [turn])] \
        if isinstance(lengths, list) else None
    if not flat or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                           for x in flat):
        raise IngestError(f"{where}: choices[0].accept_lengths must be a list of integers >= 1 "
                          "(tokens per step)")
    per_acc = tuple(x - 1 for x in flat)
    if "question_id" not in line:
        raise IngestError(f"{where}: missing field 'question_id'")
    return RequestStats(str(line["question_id"]), len(flat), sum(per_acc), None, sum(flat),
                        per_acc, None)


FORMATS: dict[str, Callable[[dict, str], RequestStats]] = {
    "vllm": _vllm, "sglang": _sglang, "llama.cpp": _llamacpp, "spec-bench": _spec_bench,
}


def read_log(path: Path, fmt: str) -> list[tuple[str, RequestStats]]:
    """(prompt id, stats) per line: ``prompt_id`` of the line if present, else the request id."""
    if fmt not in FORMATS:
        raise IngestError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    out = []
    for where, line in jsonl_objects(path, IngestError, "log file"):
        if not isinstance(line, dict):
            raise IngestError(f"{where}: expected a JSON object")
        body = line.get("response", line) if isinstance(line.get("response"), dict) else line
        stats = FORMATS[fmt](body, where)
        prompt_id = str(line.get("prompt_id") or stats.request_id)
        if not prompt_id:
            raise IngestError(f"{where}: no prompt_id and no request id to join the prompt by")
        out.append((prompt_id, stats))
    if not out:
        raise IngestError(f"{path} holds no requests")
    return out


def ingest(log: Path, fmt: str, prompts_file: Path, out_dir: Path) -> dict:
    """Write an ingested run; returns its manifest. Every line is checked before anything is
    written, and the files appear together (written to a temporary folder, then renamed)."""
    try:
        items = {item.id: item for item in read_jsonl(prompts_file)}
    except PromptSourceError as e:
        raise IngestError(str(e)) from None
    records = read_log(log, fmt)
    seen: set[str] = set()
    rows, steps = [], []
    for prompt_id, stats in records:
        if prompt_id not in items:
            raise IngestError(f"request {prompt_id!r} of {log} has no prompt in {prompts_file} "
                              "(each line's prompt_id, or the request id, must be a prompt id)")
        if prompt_id in seen:
            raise IngestError(f"request {prompt_id!r} appears twice in {log}")
        seen.add(prompt_id)
        item = items[prompt_id]
        rows.append({"prompt_id": prompt_id, "domain": item.domain,
                     "prompt_text": prompt_text(item), **asdict(stats),
                     "tokens_per_step": (stats.accepted + stats.steps) / stats.steps
                     if stats.steps else math.nan})
        if stats.per_step_accepted is not None:
            for i, a in enumerate(stats.per_step_accepted):
                steps.append({"prompt_id": prompt_id, "domain": item.domain, "step": i,
                              "accepted_len": a, "tau": a + 1,
                              "drafted": stats.per_step_drafted[i]
                              if stats.per_step_drafted is not None else None})
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise IngestError(f"{out_dir} is not empty; choose a new --out directory")
    check_writable_dir(out_dir)
    manifest = {"format": INGEST_FORMAT, "kind": "ingested", "engine_format": fmt,
                "log": str(log), "prompts_file": str(prompts_file),
                "counts": {"requests": len(rows), "steps_logged": len(steps),
                           "domains": sorted({r["domain"] for r in rows})},
                "per_step": bool(steps)}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        frame = pd.DataFrame(rows).drop(columns=["per_step_accepted", "per_step_drafted"])
        frame.to_parquet(tmp / "requests.parquet", index=False)
        if steps:
            pd.DataFrame(steps).to_parquet(tmp / "steps.parquet", index=False)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def is_ingested(run_dir: Path) -> bool:
    path = Path(run_dir) / "manifest.json"
    try:
        return json.loads(path.read_text()).get("kind") == "ingested"
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def load_ingested(run_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame | None]:
    run_dir = Path(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    requests = pd.read_parquet(run_dir / "requests.parquet")
    steps_path = run_dir / "steps.parquet"
    return manifest, requests, pd.read_parquet(steps_path) if steps_path.exists() else None
