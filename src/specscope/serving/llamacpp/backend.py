"""llama-server as a backend of ``specscope tune`` and ``specscope bench``: candidate settings
timed on prompts, returned as the bench's rows (:class:`~specscope.analysis.bench_stats.BenchRun`), so that
one summary, one interval procedure and one chooser serve every engine.

How a request is timed. Greedy, ``cache_prompt`` off (every request starts cold), the server's own
``timings``: ``prompt_ms`` (the prefill and the first token) and ``predicted_ms`` (the tokens
after it), so that a row's ``first_token_s`` is the prefill and ``time_s - first_token_s`` the
decoding speculation changes. Steps: the prefill's token is one step, and every later step emits
its accepted drafts and one token, so steps = ``predicted_n - draft_n_accepted``; tokens per step
are counted as specscope's decoder counts them.

Every repeat starts every server afresh: ``ngram-mod`` keeps its n-gram pool across requests
(a prompt sent twice to one server drafts its own earlier output the second time: 54 of 54
drafts accepted at 3.5x the first time's speed on this project's CPU), so a repeat on a warm
server would time another thing than the first. Within a repeat the prompts go in the same
order for every candidate, the candidates in an order that rotates prompt by prompt.

Nothing timed is lost to an interruption: with a ``journal``, every request is appended to it as
it is answered, and a run started again over the same journal times only what it lacks (the
repeat it stopped in on fresh servers again).

It does not choose (:mod:`specscope.tune.engine_choice`) or summarise
(:func:`~specscope.analysis.bench_stats.summarize_bench`).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from ...analysis.bench_stats import BenchRun
from ...errors import SpecscopeError
from ...files import append_line
from ...hardware import machine_line
from ...progress import counting
from ...prompts.items import PromptItem
from .programs import LlamaTools
from .server import LlamaServer, ServerSetting

PLAIN = "plain"

# what `specscope llamacpp` tunes over when no --candidate is given: plain, the draft model at
# K = 2 and at K = 4 stopped by its own confidence (--spec-draft-p-min 0.75: the draft's
# probability is the best signal of a node's acceptance the records hold), and every model-free
# lookup at llama.cpp's sizes (ngram-cache, which drafts from a corpus file specscope does not
# make, aside)
DEFAULT_CANDIDATES = (
    "plain",
    # llama.cpp's --poll 0 (threads sleep between passes): on 2 CPUs plain decoded 1.11x plain
    # at the default poll 50, and a lookup's gain there was mostly this (BENCHMARKS.md)
    "plain:poll=0",
    "draft-simple:k=2",
    "draft-simple:k=4,p_min=0.75",
    "ngram-simple",
    "ngram-map-k",
    "ngram-mod",
    "ngram-map-k:poll=0",
)


@dataclass(frozen=True)
class LlamaRequest:
    """One request as llama-server timed it (the rows of ``requests.parquet``)."""

    candidate: str
    prompt_id: str
    domain: str
    repeat: int
    tokens: int  # predicted_n
    prompt_s: float
    decode_s: float  # predicted_ms / 1000
    draft_n: int
    accepted: int
    stop_type: str
    wall_s: float = float("nan")  # the request's round trip as the client saw it
    output_ids: tuple[int, ...] = ()  # the greedy output, to set beside other candidates'
    machine: str = ""  # the machine that timed it (hardware.machine_line; "": not recorded)


def candidate_settings(texts: Sequence[str], base: ServerSetting) -> dict[str, ServerSetting]:
    """Candidate name (as written) -> setting; ``plain`` is always one (the reference)."""
    texts = list(dict.fromkeys([PLAIN, *texts]))
    return {t: ServerSetting.parse(t, base) for t in texts}


def time_candidates(
    tools: LlamaTools,
    target: Path,
    draft: Path | None,
    settings: Mapping[str, ServerSetting],
    prompts: Sequence[tuple[PromptItem, list[int]]],
    n_predict: int,
    repeats: int = 1,
    in_sample_ids: frozenset[str] = frozenset(),
    log: Callable[[str], None] | None = None,
    serve: Callable[[ServerSetting], AbstractContextManager] | None = None,
    first_repeat: int = 0,
    journal: Path | None = None,
    inside: Path | None = None,
) -> tuple[list[BenchRun], list[LlamaRequest]]:
    """Every candidate on every prompt, ``repeats`` times, servers restarted each repeat; the
    bench rows (:func:`runs_from_requests`) and every request. ``serve(setting)`` starts one
    server, whose ``complete(ids, n_predict)`` answers a :class:`Completion` (default: a
    :class:`LlamaServer` of ``target``, with ``draft`` where the setting drafts with a
    model). ``first_repeat``: the index of the first repeat (more repeats of a bench made
    before). ``journal``: a JSON-lines file every request is appended to as it is answered
    (``inside``: as :func:`~specscope.files.write_output`'s); the requests it already holds are
    not timed again (module docstring)."""
    if PLAIN not in settings:
        raise ValueError("the candidates need 'plain': it is the reference")
    if serve is None:

        def serve(s: ServerSetting) -> LlamaServer:
            return LlamaServer(tools, target, s, draft if s.uses_draft_model else None)

    names = list(settings)
    total = len(prompts) * len(names) * repeats
    reps = range(first_repeat, first_repeat + repeats)
    done = read_journal(journal, names, [item.id for item, _ in prompts], reps, n_predict)
    if journal is not None and _cut(journal):
        append_line(journal, "", inside)  # end the line an interruption cut
    if done and log:
        log(f"{len(done)} of {total} requests already timed in {journal}: timing the rest")
    requests: list[LlamaRequest] = []
    here = machine_line()
    with counting("timing requests", "requests", total, len(done)) as advance:
        for rep in reps:
            keys = [(rep, name, item.id) for item, _ in prompts for name in names]
            if all(k in done for k in keys):
                requests += [done[k] for k in keys]
                continue
            with ExitStack() as stack:
                servers = {name: stack.enter_context(serve(s)) for name, s in settings.items()}
                for i, (item, ids) in enumerate(prompts):
                    shift = (i + rep) % len(names)
                    for name in names[shift:] + names[:shift]:
                        if (rep, name, item.id) in done:
                            requests.append(done[rep, name, item.id])
                            continue
                        t0 = time.perf_counter()
                        c = servers[name].complete(ids, n_predict)
                        wall = time.perf_counter() - t0
                        request = LlamaRequest(
                            name,
                            item.id,
                            item.domain,
                            rep,
                            c.predicted_n,
                            c.prompt_ms / 1000,
                            c.predicted_ms / 1000,
                            c.draft_n,
                            c.draft_n_accepted,
                            c.stop_type,
                            wall,
                            tuple(c.tokens),
                            here,
                        )
                        requests.append(request)
                        if journal is not None:
                            append_line(journal, json.dumps(asdict(request)), inside)
                        advance()
    return runs_from_requests(requests, in_sample_ids), requests


def runs_from_requests(
    requests: Sequence[LlamaRequest], in_sample_ids: frozenset[str] = frozenset()
) -> list[BenchRun]:
    """One :class:`BenchRun` per candidate and prompt (in the requests' order of prompts, then
    candidates): the median over repeats of the request's time and, apart, of its prefill
    (the mean of the two middle ones for an even count), every repeat kept, the last repeat's
    output; steps = tokens - accepted drafts."""
    groups: dict[tuple[str, str], list[LlamaRequest]] = {}
    for r in sorted(requests, key=lambda r: r.repeat):
        groups.setdefault((r.prompt_id, r.candidate), []).append(r)
    runs = []
    for (prompt_id, name), rs in groups.items():
        times = [r.prompt_s + r.decode_s for r in rs]
        firsts = [r.prompt_s for r in rs]
        last = rs[-1]
        runs.append(
            BenchRun(
                name,
                prompt_id,
                last.domain,
                "",
                tuple(last.output_ids),
                max(last.tokens - last.accepted, 0),
                statistics.median(times),
                statistics.median(firsts),
                tuple(times),
                tuple(firsts),
                prompt_id in in_sample_ids,
            )
        )
    return runs


def _cut(path: Path) -> bool:
    """Whether ``path`` exists and its last line has no end (an interruption cut it)."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def made_here(
    r: LlamaRequest, names: Sequence[str], prompt_ids: Sequence[str], reps: range, n_predict: int
) -> bool:
    """Whether ``r`` is a request of a run that times ``names`` on ``prompt_ids``, ``reps``
    times, ``n_predict`` tokens at most (a journal or an earlier tune of another run is not)."""
    return (
        r.candidate in names
        and r.prompt_id in prompt_ids
        and r.repeat in reps
        and r.tokens <= n_predict
    )


def read_journal(
    path: Path | None,
    names: Sequence[str],
    prompt_ids: Sequence[str],
    reps: range,
    n_predict: int,
) -> dict[tuple[int, str, str], LlamaRequest]:
    """(repeat, candidate, prompt id) -> the request a journal holds; refused, naming the file,
    where it holds a request this run would not make (another bench's)."""
    if path is None or not Path(path).is_file():
        return {}
    out = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue  # a line cut by the interruption is dropped below; blank ones here
        try:
            d = json.loads(line)
            r = LlamaRequest(**{**d, "output_ids": tuple(d["output_ids"])})
        except (ValueError, TypeError, KeyError):
            continue  # the last line, cut when the run stopped
        if not made_here(r, names, prompt_ids, reps, n_predict):
            raise SpecscopeError(
                f"{path} holds a request this run would not make ({r.candidate} on "
                f"{r.prompt_id}, repeat {r.repeat + 1}, {r.tokens} tokens): it is another run's "
                "journal; remove it, or run into another --out"
            )
        out[r.repeat, r.candidate, r.prompt_id] = r
    return out


def requests_from_frame(frame: pd.DataFrame) -> list[LlamaRequest]:
    """The requests of a ``requests.parquet`` back (the output ids as tuples; a column that a
    file written before it lacks takes its default)."""
    names = [f.name for f in dataclasses.fields(LlamaRequest) if f.name in frame.columns]
    return [
        LlamaRequest(**{**row, "output_ids": tuple(int(t) for t in row["output_ids"])})
        for row in frame[names].to_dict("records")
    ]


def requests_frame(rows: Sequence[LlamaRequest]) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in rows])


def machines_by_repeat(requests: Sequence[LlamaRequest]) -> dict[str, list[int]]:
    """The machine each repeat was timed on -> those repeats (1-based), in order ("": requests
    from before the machine was recorded): a bench whose repeats ran in several sessions may
    have run on several machines."""
    out: dict[str, set[int]] = {}
    for r in requests:
        out.setdefault(r.machine, set()).add(r.repeat + 1)
    return {m: sorted(reps) for m, reps in sorted(out.items(), key=lambda kv: min(kv[1]))}
