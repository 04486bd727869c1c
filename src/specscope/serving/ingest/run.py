"""Writing an ingested run from an engine log, and reading it back.

``specscope ingest LOG --format F --prompts PROMPTS.jsonl --out DIR`` joins each finished request
of the log (:mod:`specscope.serving.ingest.logs`) to its prompt and domain, by the client's id (the
line's ``prompt_id``) or else the engine's request id (``--join id``), or by the order of the
prompts file (``--join order``, for llama-server ``/completion`` responses, which carry no id).
A join by order is refused on a line that carries a ``prompt_id``: such lines are joined by it,
and a log's order is the order its answers finished (the gateway's, under concurrency), which is
the prompts file's only for one client sending the prompts one at a time. It
writes an *ingested run*: ``manifest.json`` (``kind: ingested``, the engine, its version, the
counts that were derived and how), ``requests.parquet`` (one row per request), ``steps.parquet``
where the engine logged every verify step, and ``histogram.parquet`` where it logged (or its
steps give) how many verify steps accepted each number of drafts. ``specscope analyze`` reads it
(:mod:`specscope.analysis.stepwise`).

Every line is checked before it is kept (:mod:`specscope.serving.ingest.formats`); a line that fails is
refused naming the log file, its line, the field and the rule, and nothing is written; the lines
:class:`~specscope.serving.ingest.logs.Skipped` counts (a torn last line, answers without
statistics) are left out and named in the manifest's ``skipped`` and ``warnings``. The log is
read one line at a time and written in batches: memory grows with the prompt file, not with the
log. Node-level figures (alpha, entropies, trees) cannot come from these logs and are not invented.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ...files import read_json_object, umask, write_json
from ...progress import counting
from ...prompts.items import PromptSourceError, iter_jsonl
from ...records import check_writable_dir
from ...tune.router import prompt_text
from ..request_stats import IngestError, RequestStats
from .formats import engine_format
from .logs import LoggedRequest, Skipped, iter_requests

INGEST_FORMAT = "specscope-ingested/2"
BATCH_ROWS = (
    65_536  # rows buffered before a Parquet write: ingest's memory does not grow with the log
)
JOINS = ("id", "order")


ORDER_ONLY_IF = (
    "--join order, which is right only when the log's lines are in the prompts file's order "
    "(one client sending the prompts one at a time, in that order; the gateway logs in "
    "completion order)"
)


def iter_log(path: Path, fmt: str, skipped: Skipped | None = None):
    """(where, prompt id, stats) per finished request: the line's ``prompt_id`` if present, else
    the engine's request id (see :func:`iter_requests`; the lines left out are counted in
    ``skipped``)."""
    for logged in iter_requests(Path(path), fmt, skipped):
        if logged.stats is not None:
            yield logged.where, _id_join(logged), logged.stats


def _id_join(logged: LoggedRequest) -> str:
    if logged.prompt_id is not None:
        return logged.prompt_id
    if logged.stats.request_id == "":
        raise IngestError(
            f"{logged.where}: no prompt_id and no request id to join the prompt by "
            "(llama-server /completion responses carry none): wrap each as "
            f'{{"prompt_id": ..., "response": ...}}, or use {ORDER_ONLY_IF}'
        )
    return logged.stats.request_id


def _no_requests(log: Path, skipped: Skipped) -> IngestError:
    said = "; ".join(skipped.warnings())
    return IngestError(f"{log} holds no requests" + (f": {said}" if said else ""))


def read_log(
    path: Path, fmt: str, skipped: Skipped | None = None
) -> list[tuple[str, RequestStats]]:
    """(prompt id, stats) per finished request of a log (see :func:`iter_log`), all in memory."""
    skipped = skipped if skipped is not None else Skipped(fmt)
    out = [(prompt_id, stats) for _, prompt_id, stats in iter_log(path, fmt, skipped)]
    if not out:
        raise _no_requests(Path(path), skipped)
    return out


REQUEST_SCHEMA = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("domain", pa.string()),
        ("prompt_text", pa.string()),
        ("request_id", pa.string()),
        ("steps", pa.int64()),
        ("accepted", pa.int64()),
        ("drafted", pa.int64()),
        ("generated", pa.int64()),
        ("tokens_per_step", pa.float64()),
        ("derived", pa.string()),
    ]
)
STEP_SCHEMA = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("domain", pa.string()),
        ("step", pa.int64()),
        ("accepted_len", pa.int64()),
        ("tau", pa.int64()),
        ("drafted", pa.int64()),
    ]
)
HISTOGRAM_SCHEMA = pa.schema(
    [  # verify steps of a request that accepted `accepted_len` drafts
        ("prompt_id", pa.string()),
        ("domain", pa.string()),
        ("accepted_len", pa.int64()),
        ("steps", pa.int64()),
    ]
)


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
        batch = pa.record_batch(
            [pa.array(c, f.type) for c, f in zip(self.columns, self.schema)], schema=self.schema
        )
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


def _prompts(path: Path) -> dict[str, tuple[str, str] | str]:
    """id -> (domain, prompt text) of a prompt file in its order, read one line at a time."""
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


class _Tables:
    """The run's three Parquet tables, written as requests arrive."""

    def __init__(self, folder: Path):
        self.requests = _ParquetRows(folder / "requests.parquet", REQUEST_SCHEMA)
        self.steps = _ParquetRows(folder / "steps.parquet", STEP_SCHEMA)
        self.histogram = _ParquetRows(folder / "histogram.parquet", HISTOGRAM_SCHEMA)

    def add(self, prompt_id: str, domain: str, text: str, stats: RequestStats) -> None:
        self.requests.add(
            prompt_id,
            domain,
            text,
            stats.request_id,
            stats.steps,
            stats.accepted,
            stats.drafted,
            stats.generated,
            (stats.accepted + stats.steps) / stats.steps if stats.steps else math.nan,
            ",".join(stats.derived),
        )
        if stats.per_step_accepted is not None:
            for i, a in enumerate(stats.per_step_accepted):
                self.steps.add(
                    prompt_id,
                    domain,
                    i,
                    a,
                    a + 1,
                    stats.per_step_drafted[i] if stats.per_step_drafted is not None else None,
                )
        for j, n in enumerate(stats.histogram or ()):
            if n:
                self.histogram.add(prompt_id, domain, j, n)

    def close(self) -> tuple[int, int]:
        """(requests, steps) written."""
        self.histogram.close()
        return self.requests.close(), self.steps.close()

    def abandon(self) -> None:
        for table in (self.requests, self.steps, self.histogram):
            table.abandon()


@dataclass
class _Seen:
    """What the log showed while it was written: domains, derived counts, engine version."""

    version: str | None
    version_from: str | None
    domains: set = field(default_factory=set)
    derived: set = field(default_factory=set)
    histogram: bool = False

    def engine_version(self, stats: RequestStats, where: str) -> None:
        logged = stats.engine_version
        if logged is None or logged == self.version:
            return
        if self.version is None:
            self.version, self.version_from = logged, "log"
            return
        said = "--engine-version" if self.version_from == "option" else "earlier lines"
        raise IngestError(
            f"{where}: engine version {logged!r} differs from {self.version!r} "
            f"({said}); ingest one engine version per run"
        )


def _next_in_order(order, logged: LoggedRequest, prompts_file: Path) -> str:
    """The prompt the n-th line joins by order; a line that carries a prompt_id is refused."""
    if logged.prompt_id is not None:
        raise IngestError(
            f"{logged.where}: the line carries prompt_id {logged.prompt_id!r}: a log whose "
            "lines carry prompt ids is joined by them (--join id, the default); --join order is "
            "only for logs whose lines carry no id, as a log's lines are in the order the "
            "answers finished (the gateway's, under concurrency), not the prompts file's"
        )
    prompt_id = next(order, None)
    if prompt_id is None:
        raise IngestError(
            f"{logged.where}: the log has more requests than {prompts_file} has prompts "
            "(--join order)"
        )
    return prompt_id


def _unknown_prompt(prompt_id: str, logged: LoggedRequest, prompts_file: Path) -> IngestError:
    if logged.prompt_id is not None:
        how = (
            "each line's prompt_id must be an id of the prompts file (the gateway writes the "
            "client's X-Prompt-Id header there, or an id of its own when the client sent none: "
            "send each prompt's id as X-Prompt-Id)"
        )
    else:
        how = (
            "the engine's request id is no prompt id: wrap each line as "
            f'{{"prompt_id": ..., "response": ...}}, or use {ORDER_ONLY_IF}'
        )
    return IngestError(
        f"request {prompt_id!r} of {logged.where} has no prompt in {prompts_file}: {how}"
    )


def _join_and_write(
    log: Path,
    fmt: str,
    join: str,
    items: dict[str, tuple[str, str] | str],
    prompts_file: Path,
    tables: _Tables,
    seen: _Seen,
    skipped: Skipped,
) -> None:
    """Each finished request of ``log`` joined to its prompt and added to ``tables``.
    ``items``: the prompts by id in file order (each replaced by the joining line's path:line).
    An answer without statistics is left out (counted in ``skipped``); joined by order, it still
    takes its prompt's place."""
    order = iter(list(items)) if join == "order" else None
    with counting("ingesting", "requests", len(items)) as advance:
        for logged in iter_requests(log, fmt, skipped):
            if order is not None:
                prompt_id = _next_in_order(order, logged, prompts_file)
            if logged.stats is None:
                continue
            if order is None:
                prompt_id = _id_join(logged)
            if prompt_id not in items:
                raise _unknown_prompt(prompt_id, logged, prompts_file)
            if isinstance(items[prompt_id], str):
                raise IngestError(
                    f"request {prompt_id!r} of {logged.where} appears twice in {log} (first at "
                    f"{items[prompt_id]}): each prompt joins one answer (a client that retried a "
                    "request with the same id logs it twice; keep the line to measure)"
                )
            domain, text = items[prompt_id]
            items[prompt_id] = logged.where  # joined: a second line is refused, the text is freed
            seen.domains.add(domain)
            seen.derived.update(logged.stats.derived)
            seen.histogram |= bool(logged.stats.histogram)
            seen.engine_version(logged.stats, logged.where)
            tables.add(prompt_id, domain, text, logged.stats)
            advance()


def ingest(
    log: Path,
    fmt: str,
    prompts_file: Path,
    out_dir: Path,
    join: str = "id",
    engine_version: str | None = None,
) -> dict:
    """Write an ingested run; returns its manifest.

    ``join``: ``id`` (each line's prompt_id, else the engine's request id) or ``order`` (the
    n-th finished request joins the n-th prompt; refused on a line that carries a prompt_id).
    Lines left out (a torn last line, answers without statistics) are counted in the manifest's
    ``skipped`` and said in its ``warnings``. ``engine_version``: the engine's version, checked
    against the versions the format reads and against the version the log states, if any.

    The log is read one line at a time and written in batches, so memory grows with the prompt
    file but not with the log. The files appear together or not at all: they are written to a
    temporary folder beside ``out_dir``, renamed when every line has passed its checks, and
    removed on any failure (a bad line, a full disk). Modes follow the umask."""
    spec = engine_format(fmt)
    if join not in JOINS:
        raise IngestError(f"unknown --join {join!r}; allowed: {', '.join(JOINS)}")
    if engine_version is not None:
        spec.check_version(engine_version)
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    items = _prompts(prompts_file)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        try:
            tables = _Tables(tmp)
            seen = _Seen(engine_version, "option" if engine_version else None)
            skipped = Skipped(fmt)
            try:
                _join_and_write(log, fmt, join, items, prompts_file, tables, seen, skipped)
                n_requests, n_steps = tables.close()
            except BaseException:
                tables.abandon()
                raise
            if not n_requests:
                raise _no_requests(log, skipped)
            manifest = {
                "format": INGEST_FORMAT,
                "kind": "ingested",
                "engine_format": fmt,
                "engine": spec.engine,
                "engine_version": seen.version,
                "engine_version_from": seen.version_from,
                "parser_source": spec.source,
                "join": join,
                "log": str(log),
                "prompts_file": str(prompts_file),
                "counts": {
                    "requests": n_requests,
                    "steps_logged": n_steps,
                    "domains": sorted(seen.domains),
                },
                "per_step": bool(n_steps),
                "histogram": seen.histogram,
                "derived": {name: spec.derivations[name] for name in sorted(seen.derived)},
                "skipped": skipped.as_dict(),
                "warnings": skipped.warnings(),
            }
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
        return (
            read_json_object(Path(run_dir) / "manifest.json", IngestError).get("kind") == "ingested"
        )
    except IngestError:
        return False


REQUIRED_COLUMNS = ("prompt_id", "domain", "steps", "accepted")


def _read_table(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise IngestError(f"{path} is missing; ingest the log again (specscope ingest)")
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise IngestError(
            f"{path} is damaged ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "ingest the log again"
        ) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise IngestError(
            f"{path} has no column {', '.join(map(repr, missing))}; ingest the log again"
        )
    return frame


def load_ingested(run_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame | None]:
    """The manifest, requests and (if logged) steps of an ingested run; a missing, damaged or
    incomplete file raises IngestError naming it."""
    run_dir = Path(run_dir)
    manifest = read_json_object(run_dir / "manifest.json", IngestError, "manifest")
    requests = _read_table(run_dir / "requests.parquet", REQUIRED_COLUMNS)
    for column in ("steps", "accepted", "drafted"):
        if column in requests and not pd.api.types.is_numeric_dtype(requests[column]):
            raise IngestError(
                f"{run_dir / 'requests.parquet'}: column {column!r} is not "
                "numeric; ingest the log again"
            )
    steps_path = run_dir / "steps.parquet"
    steps = (
        _read_table(steps_path, ("prompt_id", "step", "accepted_len"))
        if steps_path.exists()
        else None
    )
    return manifest, requests, steps


def load_histogram(run_dir: Path) -> pd.DataFrame | None:
    """The run's histogram table (prompt_id, domain, accepted_len, steps), if it has one."""
    path = Path(run_dir) / "histogram.parquet"
    return (
        _read_table(path, ("prompt_id", "domain", "accepted_len", "steps"))
        if path.exists()
        else None
    )
