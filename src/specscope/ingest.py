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

Every line is checked before it is kept: counts are non-negative integers that fit int64, and
they must be possible (:func:`check_counts`: accepted <= drafted; no verify step, no accepted
draft; accepted + verify steps <= tokens generated where the engine logs them). A line that fails
is refused naming the log file, its line, the field and the rule, and nothing is written. The log
is read one line at a time and written in batches: memory grows with the prompt file, not with
the log.

Node-level figures (alpha, entropies, trees) cannot come from these logs and are not invented.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import SpecscopeError
from .files import read_json_object, umask, write_json
from .prompts.items import PromptSourceError, iter_jsonl, jsonl_objects
from .records import check_writable_dir
from .tune.router import prompt_text

INGEST_FORMAT = "specscope-ingested/1"


class IngestError(SpecscopeError, ValueError):
    """A log line or prompt file that cannot be ingested; the message names the field."""


INT64_MAX = 2**63 - 1  # counts are stored as int64: a larger one is no count an engine logs
BATCH_ROWS = 65_536  # rows buffered before a Parquet write: ingest's memory does not grow with the log


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


def _is_count(value, least: int = 0) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and least <= value <= INT64_MAX)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _field(obj: dict, key: str, where: str, kind=int):
    if key not in obj:
        raise IngestError(f"{where}: missing field {key!r}")
    value = obj[key]
    if kind is int and not _is_count(value):
        raise IngestError(f"{where}: field {key!r} must be a non-negative integer of at most "
                          f"2**63 - 1 (int64), got {_shown(value)}")
    if kind is list and not (isinstance(value, list) and all(_is_count(v) for v in value)):
        raise IngestError(f"{where}: field {key!r} must be a list of non-negative integers of "
                          "at most 2**63 - 1 (int64)")
    return value


def _section(line: dict, key: str, where: str, what: str) -> dict:
    value = line.get(key)
    if not isinstance(value, dict):
        raise IngestError(f"{where}: no {key} ({what})")
    return value


def check_counts(where: str, names: dict[str, str], steps: int, accepted: int,
                 drafted: int | None = None, generated: int | None = None) -> None:
    """Refuse counts no engine can log: accepted drafts never exceed drafted ones; no verify
    step, no accepted draft; every verify step yields its accepted drafts and one token of the
    target, so accepted + steps never exceed the tokens generated. ``names``: each count's field
    as the log spells it (keys steps, accepted, drafted, generated)."""
    if drafted is not None and accepted > drafted:
        raise IngestError(f"{where}: {names['accepted']} ({accepted}) exceeds {names['drafted']} "
                          f"({drafted}); accepted drafts cannot outnumber drafted ones")
    if steps == 0 and accepted:
        raise IngestError(f"{where}: {names['steps']} is 0 but {names['accepted']} is {accepted}; "
                          "without a verify step no draft is accepted")
    if generated is not None and accepted + steps > generated:
        raise IngestError(f"{where}: {names['accepted']} + {names['steps']} ({accepted} + {steps}) "
                          f"exceeds {names['generated']} ({generated}); each verify step yields "
                          "its accepted drafts and one token of the target")


def _vllm(line: dict, where: str) -> RequestStats:
    body = line.get("data", line) if isinstance(line.get("data"), dict) else line
    spec = body.get("metrics")
    spec = spec.get("speculative_decoding") if isinstance(spec, dict) else None
    if not isinstance(spec, dict):
        raise IngestError(f"{where}: no metrics.speculative_decoding (start vLLM with "
                          "--per-request-spec-decode-metrics summary or detailed)")
    usage = body.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise IngestError(f"{where}: field 'usage' must be an object, got {_shown(usage)}")
    generated = None
    if usage is not None and usage.get("completion_tokens") is not None:
        generated = _field(usage, "completion_tokens", f"{where}: usage")
    where = f"{where}: metrics.speculative_decoding"
    steps = _field(spec, "num_spec_steps", where)
    accepted = _field(spec, "num_accepted_draft_tokens", where)
    drafted = _field(spec, "num_draft_tokens", where)
    check_counts(where, {"steps": "num_spec_steps", "accepted": "num_accepted_draft_tokens",
                         "drafted": "num_draft_tokens", "generated": "usage.completion_tokens"},
                 steps, accepted, drafted, generated)
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
        if sum(per_draft) != drafted:
            raise IngestError(f"{where}: per_step_drafted must sum to num_draft_tokens "
                              f"({drafted}), not {sum(per_draft)}")
    return RequestStats(str(body.get("id", "")), steps, accepted, drafted, generated,
                        per_acc, per_draft)


def _sglang(line: dict, where: str) -> RequestStats:
    meta = _section(line, "meta_info", where, "an SGLang /generate response")
    where = f"{where}: meta_info"
    steps = _field(meta, "spec_verify_ct", where)
    generated = _field(meta, "completion_tokens", where)
    if steps and generated < steps + 1:
        raise IngestError(f"{where}: completion_tokens ({generated}) is less than "
                          f"spec_verify_ct + 1 ({steps + 1}); each verify step yields at least "
                          "one token, and the prefill one")
    if not steps and generated > 1:
        raise IngestError(f"{where}: spec_verify_ct is 0 but completion_tokens is {generated}; "
                          "without a verify step no draft is accepted and only the prefill's "
                          "token is generated (was speculative decoding on?)")
    return RequestStats(str(meta.get("id", "")), steps, max(generated - 1 - steps, 0), None,
                        generated)


def _llamacpp(line: dict, where: str) -> RequestStats:
    timings = _section(line, "timings", where, "a llama-server completion response")
    where = f"{where}: timings"
    drafted = _field(timings, "draft_n", where)
    accepted = _field(timings, "draft_n_accepted", where)
    generated = _field(timings, "predicted_n", where)
    names = {"steps": "draft_n_verif_steps", "accepted": "draft_n_accepted",
             "drafted": "draft_n", "generated": "predicted_n"}
    if "draft_n_verif_steps" in timings:
        steps = _field(timings, "draft_n_verif_steps", where)
    else:  # every token after the first comes from a verify step: its accepted drafts + 1
        steps = max(generated - 1 - accepted, 0)
        names["steps"] = "verify steps (predicted_n - 1 - draft_n_accepted)"
    check_counts(where, names, steps, accepted, drafted, generated)
    return RequestStats(str(line.get("id", line.get("id_slot", ""))), steps, accepted, drafted,
                        generated)


def _spec_bench(line: dict, where: str) -> RequestStats:
    choices = line.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise IngestError(f"{where}: no choices (a Spec-Bench answer line)")
    lengths = choices[0].get("accept_lengths")
    flat = [x for turn in lengths for x in (turn if isinstance(turn, list) else [turn])] \
        if isinstance(lengths, list) else None
    if not flat or not all(_is_count(x, least=1) for x in flat) or sum(flat) > INT64_MAX:
        raise IngestError(f"{where}: choices[0].accept_lengths must be a list of integers >= 1 "
                          "(tokens per step) whose sum is at most 2**63 - 1 (int64)")
    per_acc = tuple(x - 1 for x in flat)
    if "question_id" not in line:
        raise IngestError(f"{where}: missing field 'question_id'")
    return RequestStats(str(line["question_id"]), len(flat), sum(per_acc), None, sum(flat),
                        per_acc, None)


FORMATS: dict[str, Callable[[dict, str], RequestStats]] = {
    "vllm": _vllm, "sglang": _sglang, "llama.cpp": _llamacpp, "spec-bench": _spec_bench,
}


def _prompt_id(line: dict, stats: RequestStats, where: str) -> str:
    """The line's ``prompt_id`` (0 included) if it carries one, else the engine's request id."""
    value = line.get("prompt_id")
    if value is None:
        value = stats.request_id
    elif not isinstance(value, (str, int)) or isinstance(value, bool):
        raise IngestError(f"{where}: field 'prompt_id' must be a string or an integer, got "
                          f"{_shown(value)}")
    if value == "":
        raise IngestError(f"{where}: no prompt_id and no request id to join the prompt by")
    return str(value)


def iter_log(path: Path, fmt: str) -> Iterator[tuple[str, str, RequestStats]]:
    """(where, prompt id, stats) per line, read one line at a time: ``prompt_id`` of the line if
    present, else the request id; every line checked (:func:`check_counts`)."""
    if fmt not in FORMATS:
        raise IngestError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    for where, line in jsonl_objects(path, IngestError, "log file"):
        if not isinstance(line, dict):
            raise IngestError(f"{where}: expected a JSON object")
        body = line.get("response", line) if isinstance(line.get("response"), dict) else line
        stats = FORMATS[fmt](body, where)
        yield where, _prompt_id(line, stats, where), stats


def read_log(path: Path, fmt: str) -> list[tuple[str, RequestStats]]:
    """(prompt id, stats) per line of a log (see :func:`iter_log`), all in memory."""
    out = [(prompt_id, stats) for _, prompt_id, stats in iter_log(path, fmt)]
    if not out:
        raise IngestError(f"{path} holds no requests")
    return out


REQUEST_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("domain", pa.string()), ("prompt_text", pa.string()),
    ("request_id", pa.string()), ("steps", pa.int64()), ("accepted", pa.int64()),
    ("drafted", pa.int64()), ("generated", pa.int64()), ("tokens_per_step", pa.float64())])
STEP_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("domain", pa.string()), ("step", pa.int64()),
    ("accepted_len", pa.int64()), ("tau", pa.int64()), ("drafted", pa.int64())])


class _ParquetRows:
    """Rows appended one at a time and written to ``path`` in batches of :data:`BATCH_ROWS`;
    the file is created by the first batch (none: no file)."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path, self.schema = path, schema
        self.columns: list[list] = [[] for _ in schema.names]
        self.rows = 0
        self.writer: pq.ParquetWriter | None = None

    def add(self, *values) -> None:
        for column, value in zip(self.columns, values):
            column.append(value)
        if len(self.columns[0]) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.columns[0]:
            return
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, self.schema)
        batch = pa.record_batch([pa.array(c, f.type) for c, f in zip(self.columns, self.schema)],
                                schema=self.schema)
        self.writer.write_batch(batch)
        self.rows += len(self.columns[0])
        for column in self.columns:
            column.clear()

    def close(self) -> int:
        """Write what is left; the number of rows written."""
        self.flush()
        if self.writer is not None:
            self.writer.close()
        return self.rows

    def abandon(self) -> None:
        """Close the file without caring what it holds (its folder is about to be removed)."""
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()


def _prompts(path: Path) -> dict[str, tuple[str, str] | None]:
    """id -> (domain, prompt text) of a prompt file, read one line at a time."""
    try:
        return {item.id: (item.domain, prompt_text(item)) for item in iter_jsonl(path)}
    except PromptSourceError as e:
        raise IngestError(str(e)) from None


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise IngestError(f"--out {out_dir} is a file; give a new directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise IngestError(f"{out_dir} is not empty; choose a new --out directory")
    check_writable_dir(out_dir)


def _write_run(tmp: Path, log: Path, fmt: str, items: dict[str, tuple[str, str] | None],
               prompts_file: Path) -> tuple[int, int, set[str]]:
    """requests.parquet and steps.parquet of ``log`` in ``tmp``, one line at a time; returns the
    numbers of requests and steps and the domains. ``items``: the prompts by id (each set to None
    once a line has joined it)."""
    requests = _ParquetRows(tmp / "requests.parquet", REQUEST_SCHEMA)
    steps = _ParquetRows(tmp / "steps.parquet", STEP_SCHEMA)
    try:
        domains = _join_and_write(log, fmt, items, prompts_file, requests, steps)
        n_steps, n_requests = steps.close(), requests.close()
    except BaseException:
        requests.abandon()
        steps.abandon()
        raise
    if not n_requests:
        raise IngestError(f"{log} holds no requests")
    return n_requests, n_steps, domains


def _join_and_write(log: Path, fmt: str, items: dict[str, tuple[str, str] | None],
                    prompts_file: Path, requests: _ParquetRows, steps: _ParquetRows) -> set[str]:
    """Each line of ``log`` joined to its prompt and added to ``requests`` (and ``steps``); the
    domains seen."""
    domains: set[str] = set()
    for where, prompt_id, stats in iter_log(log, fmt):
        if prompt_id not in items:
            raise IngestError(f"request {prompt_id!r} of {where} has no prompt in {prompts_file} "
                              "(each line's prompt_id, or the request id, must be a prompt id)")
        if items[prompt_id] is None:
            raise IngestError(f"request {prompt_id!r} of {where} appears twice in {log}")
        domain, text = items[prompt_id]
        items[prompt_id] = None  # joined: a second line for it is refused, its text is freed
        domains.add(domain)
        requests.add(prompt_id, domain, text, stats.request_id, stats.steps, stats.accepted,
                     stats.drafted, stats.generated,
                     (stats.accepted + stats.steps) / stats.steps if stats.steps else math.nan)
        if stats.per_step_accepted is not None:
            for i, a in enumerate(stats.per_step_accepted):
                steps.add(prompt_id, domain, i, a, a + 1, stats.per_step_drafted[i]
                          if stats.per_step_drafted is not None else None)
    return domains


def ingest(log: Path, fmt: str, prompts_file: Path, out_dir: Path) -> dict:
    """Write an ingested run; returns its manifest.

    The log is read one line at a time and written in batches, so memory grows with the prompt
    file but not with the log. The files appear together or not at all: they are written to a
    temporary folder beside ``out_dir``, renamed when every line has passed its checks, and
    removed on any failure (a bad line, a full disk). Modes follow the umask."""
    if fmt not in FORMATS:
        raise IngestError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    items = _prompts(prompts_file)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        try:
            n_requests, n_steps, domains = _write_run(tmp, log, fmt, items, prompts_file)
            manifest = {"format": INGEST_FORMAT, "kind": "ingested", "engine_format": fmt,
                        "log": str(log), "prompts_file": str(prompts_file),
                        "counts": {"requests": n_requests, "steps_logged": n_steps,
                                   "domains": sorted(domains)},
                        "per_step": bool(n_steps)}
            write_json(tmp / "manifest.json", manifest)
            tmp.chmod(0o777 & ~umask())  # mkdtemp made it 0700
            if out_dir.exists():
                out_dir.rmdir()  # empty, checked above
            os.replace(tmp, out_dir)
        except OSError as e:
            raise IngestError(f"cannot ingest {log} into {out_dir}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def is_ingested(run_dir: Path) -> bool:
    """Whether ``run_dir``'s manifest says it is an ingested run (an unreadable one is not)."""
    try:
        return read_json_object(Path(run_dir) / "manifest.json", IngestError).get(
            "kind") == "ingested"
    except IngestError:
        return False


REQUIRED_COLUMNS = ("prompt_id", "domain", "steps", "accepted")


def _read_table(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise IngestError(f"{path} is missing; ingest the log again (specscope ingest)")
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise IngestError(f"{path} is damaged ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                          "ingest the log again") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise IngestError(f"{path} has no column {', '.join(map(repr, missing))}; "
                          "ingest the log again")
    return frame


def load_ingested(run_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame | None]:
    """The manifest, requests and (if logged) steps of an ingested run; a missing, damaged or
    incomplete file raises IngestError naming it."""
    run_dir = Path(run_dir)
    manifest = read_json_object(run_dir / "manifest.json", IngestError, "manifest")
    requests = _read_table(run_dir / "requests.parquet", REQUIRED_COLUMNS)
    for column in ("steps", "accepted", "drafted"):
        if column in requests and not pd.api.types.is_numeric_dtype(requests[column]):
            raise IngestError(f"{run_dir / 'requests.parquet'}: column {column!r} is not "
                              "numeric; ingest the log again")
    steps_path = run_dir / "steps.parquet"
    steps = _read_table(steps_path, ("prompt_id", "step", "accepted_len")) \
        if steps_path.exists() else None
    return manifest, requests, steps
