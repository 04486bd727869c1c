"""One bench for every backend: a :class:`BenchPlan` (what a backend times, on which prompts, and
what the policy predicted and chose) in, a :class:`BenchResult` (tables, verdicts, the record)
out, the same steps whatever the engine:

1. time every method on every held-out prompt (:func:`.bench.run_bench`, the one loop);
2. summarise per domain (:func:`~specscope.analysis.bench_stats.summarize_bench`): one estimate
   of each prompt's decoding time, the median over its repeats, read by every table and verdict;
3. predicted against measured for every cell, and each interval's width against ±5%;
4. the policy's decision: each domain's regret (its choice against the best measured), and routed
   against the best single method;
5. one record: the backend's own part (``head``, ``tail``), then the rows and the conclusions.

The backends build their plans: specscope's decoder and transformers
(:func:`.bench.decoder_plan`), llama-server spawned from a policy's GGUF files
(:func:`specscope.serving.llamacpp.study.llama_server_plan`) and servers already running at URLs
(:func:`specscope.serving.openai_server.openai_plan`). This module does not time anything itself
or know any engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.bench_stats import (
    DERIVED_METHODS,
    BenchRow,
    BenchRun,
    Regret,
    RoutedAgainstSingle,
    SpeedupPrecision,
    regrets,
    routed_against_best_single,
    routed_regrets,
    speedup_precision,
    summarize_bench,
)
from ..analysis.render import Column, Grid, to_markdown
from ..files import write_json, write_output
from .backends import Backend, Request, requests_frame
from .bench import (
    BenchCheckpoint,
    BenchPrompts,
    Loop,
    OutputAgreement,
    PolicyPrediction,
    PredictedCell,
    Prompt,
    agreement_grid,
    checks_document,
    precision_grid,
    predicted_vs_measured,
    prediction_grid,
    regret_grid,
    run_bench,
)

Log = Callable[[str], None]


@dataclass(frozen=True)
class BenchPlan:
    """What one bench times and how it is judged, as a backend's plan function builds it.

    ``methods``: method -> a backend setting or a :class:`~.bench.Route`; ``choices``: domain ->
    the method that decodes as the policy's entry for it (what regret scores; a domain missing
    is scored on the prompts ``routed`` sent to its entry, or named unscored); ``derived``: the
    methods that are not candidates of their own (routed, and for a server backend uniform,
    whose requests are the candidates' own). ``head`` and ``tail``: the backend's part of the
    record, before the rows and after the conclusions; ``keep``: which timings the record holds
    (``runs``, ``requests``, or none where they are written apart)."""

    backend: Backend
    methods: Mapping[str, object]
    prompts: Sequence[Prompt]
    chosen: BenchPrompts
    loop: Loop
    title: str
    predictions: Mapping[str, PolicyPrediction] = field(default_factory=dict)
    candidates: Mapping[tuple[str, str], PolicyPrediction] = field(default_factory=dict)
    routed: Mapping[str, PolicyPrediction] = field(default_factory=dict)
    choices: Mapping[str, str] | None = None  # None: no policy decided anything
    derived: tuple[str, ...] = ("routed",)
    checkpoint: BenchCheckpoint | None = None
    earlier: Sequence[Request] = ()
    head: Mapping = field(default_factory=dict)
    tail: Mapping = field(default_factory=dict)
    keep: str | None = "runs"
    # the in-sample outputs against the tuning runs' (None: not compared)
    agreement: Callable[[Sequence[BenchRun]], Sequence[OutputAgreement]] | None = None
    agreement_against: str = "the outputs the tuning runs recorded"
    n_boot: int = 2000
    tuned_on: str | None = None  # the machine the policy was timed on (with check_machines)
    check_machines: bool = False  # name the machines where they differ from tuned_on


@dataclass(frozen=True)
class Decision:
    """What a bench says of a policy's choices: per domain its regret, the domains it could not
    score, and routed against the best single method (None: routed not timed beside two or more
    others)."""

    regret: tuple[Regret, ...] = ()
    unscored: tuple[str, ...] = ()
    routed_vs_best_single: RoutedAgainstSingle | None = None

    def to_dict(self) -> dict:
        out: dict = {}
        if self.regret:
            out["regret"] = [r.to_dict() for r in self.regret]
        if self.unscored:
            out["unscored"] = list(self.unscored)
        if self.routed_vs_best_single is not None:
            out["routed_vs_best_single"] = self.routed_vs_best_single.to_dict()
        return out


@dataclass(frozen=True)
class BenchResult:
    """What :func:`bench` measured and concluded."""

    requests: tuple[Request, ...]
    runs: tuple[BenchRun, ...]
    rows: tuple[BenchRow, ...]
    cells: tuple[PredictedCell, ...]
    precision: tuple[SpeedupPrecision, ...]
    decision: Decision
    agreement: tuple[OutputAgreement, ...]
    grids: tuple[Grid, ...]
    document: dict
    notes: tuple[str, ...]  # sentences after the tables (routed against the best single, machines)

    def summary(self) -> str:
        """The tables and notes as markdown."""
        text = "\n\n".join(to_markdown(g) for g in self.grids)
        return text + "".join(f"\n\n{n}" for n in self.notes) + "\n"


def decide(
    choices: Mapping[str, str] | None,
    domains: Sequence[str],
    rows: Sequence[BenchRow],
    runs: Sequence[BenchRun],
    methods: Sequence[str],
    derived: Sequence[str] = DERIVED_METHODS,
    n_boot: int = 2000,
) -> Decision:
    """Per domain the chosen method's regret against the best method measured (every timed
    method but ``derived`` a candidate): on all the domain's prompts where a method times the
    choice, else on the prompts the router sent to the domain's entry
    (:func:`~specscope.analysis.bench_stats.routed_regrets`), else the domain is unscored; with ``routed`` timed beside
    two or more methods, routed against the best single one."""
    if choices is None:
        return Decision()
    scored = regrets(rows, runs, choices, derived=derived, n_boot=n_boot) if choices else ()
    unscored = [d for d in domains if d not in choices]
    if unscored and "routed" in methods:
        by_route, unscored = routed_regrets(runs, unscored)
        scored += by_route
    single = None
    if "routed" in methods and len(methods) > 2:
        single = routed_against_best_single(runs, n_boot, derived=derived)
    return Decision(tuple(scored), tuple(unscored), single)


def machines_by_repeat(requests: Sequence[Request]) -> dict[str, list[int]]:
    """The machine each repeat was timed on -> those repeats (1-based), in order ("": requests
    from before the machine was recorded): a bench whose repeats ran in several sessions may
    have run on several machines."""
    out: dict[str, set[int]] = {}
    for r in requests:
        out.setdefault(r.machine, set()).add(r.repeat + 1)
    return {m: sorted(reps) for m, reps in sorted(out.items(), key=lambda kv: min(kv[1]))}


def machines_note(machines: Mapping[str, list[int]], tuned_on: str | None) -> str | None:
    """A sentence where a bench's repeats ran on more than one machine, or on another than the
    tune's (whose timings every speed prediction comes from); None where all ran on one machine
    that is the tune's or is not recorded."""
    known = {m for m in machines if m}
    if len(machines) < 2 and known <= {tuned_on}:
        return None
    runs = "; ".join(
        f"repeat{'s' if len(reps) > 1 else ''} {', '.join(map(str, reps))} on "
        f"{m or 'a machine not recorded'}"
        for m, reps in machines.items()
    )
    return (
        f"Timed on more than one machine or another than the tune's: {runs}. The speed "
        f"predictions come from timings on {tuned_on or 'a machine not recorded'}; between "
        "repeats, the intervals hold what the machines differ by."
    )


def bench(plan: BenchPlan, log: Log | None = None) -> BenchResult:
    """Time ``plan`` and conclude (module docstring)."""
    timed = run_bench(
        plan.backend, plan.prompts, plan.methods, plan.loop, log, plan.checkpoint, plan.earlier
    )
    runs, requests = timed.runs, timed.requests
    rows = summarize_bench(runs, plan.n_boot)
    chosen = plan.chosen
    cells = predicted_vs_measured(
        rows, runs, plan.predictions, plan.candidates, chosen.tuning_per_domain, plan.routed
    )
    precision = speedup_precision(runs, n_boot=plan.n_boot)
    domains = list(dict.fromkeys(it.domain for it in chosen.items))
    decision = decide(
        plan.choices, domains, rows, runs, list(plan.methods), plan.derived, plan.n_boot
    )
    agreement = tuple(plan.agreement(runs)) if plan.agreement and chosen.in_sample_ids else ()
    grids = [bench_grid(rows, plan.title), prediction_grid(cells, chosen.tuned)]
    if decision.regret or decision.unscored:
        grids.append(regret_grid(decision.regret, decision.unscored))
    if agreement:
        grids.append(agreement_grid(agreement, plan.agreement_against))
    grids.append(precision_grid(precision))
    notes = []
    if decision.routed_vs_best_single is not None:
        notes.append(decision.routed_vs_best_single.sentence)
    if plan.check_machines and (note := machines_note(machines_by_repeat(requests), plan.tuned_on)):
        notes.append(note)
    kept = {
        "runs": {"runs": [dataclasses.asdict(r) for r in runs]},
        "requests": {"requests": [r.to_dict() for r in requests]},
    }.get(plan.keep or "", {})
    machines = {}
    if plan.check_machines:  # after the backend's name: the machine of every repeat
        found = machines_by_repeat(requests)
        machines = {"machines": {m or "not recorded": reps for m, reps in found.items()}}
    document = {
        **dict(list(plan.head.items())[:1]),
        **machines,
        **plan.head,
        "rows": [dataclasses.asdict(r) for r in rows],
        **kept,
        **checks_document(chosen, cells, precision),
        **decision.to_dict(),
        **(
            {"outputs_vs_run": [dataclasses.asdict(a) for a in agreement]} if plan.agreement else {}
        ),
        **plan.tail,
    }
    return BenchResult(
        requests,
        tuple(runs),
        tuple(rows),
        tuple(cells),
        tuple(precision),
        decision,
        agreement,
        tuple(grids),
        document,
        tuple(notes),
    )


def save(plan: BenchPlan, result: BenchResult, out: Path, inside: Path | None = None) -> Path:
    """The record, written whole, then the checkpoint removed: a JSON file at ``out``, or for a
    plan that keeps its requests apart (``keep`` None: a server bench) the directory ``out``
    with ``bench.json``, every request in ``requests.parquet`` and the tables in ``summary.md``.
    Returns the record's path."""
    if plan.keep is None:
        frame = requests_frame(result.requests)
        write_output(out / "requests.parquet", frame.to_parquet(None, index=False), inside)
        write_output(out / "summary.md", result.summary(), inside)
        out = out / "bench.json"
    write_json(out, result.document, inside)
    if plan.checkpoint is not None:
        plan.checkpoint.path.unlink(missing_ok=True)
    return out


# the bench's summary table: each method per domain


def _speedup(r: BenchRow) -> str:
    interval = f" [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]" if r.speedup_lo == r.speedup_lo else ""
    return f"{r.speedup:.2f}x{interval}"


BENCH_COLUMNS = (
    "domain",
    "method",
    "prompts",
    "tokens",
    "decode tok/s",
    "speed-up (95% CI)",
    "tok/s e2e",
    "speed-up e2e",
    "tau",
    "= plain",
)


def bench_grid(rows: Sequence[BenchRow], title: str) -> Grid:
    """Tokens per second and speed-up of each method per domain."""
    cells = tuple(
        (
            r.domain,
            r.method,
            r.prompts,
            r.tokens,
            f"{r.decode_tokens_per_s:.2f}",
            _speedup(r),
            f"{r.tokens_per_s:.2f}",
            f"{r.e2e_speedup:.2f}x",
            "-" if r.tau != r.tau else f"{r.tau:.2f}",
            "yes" if r.exact else "no",
        )
        for r in rows
    )
    return Grid("bench", title, tuple(Column(c) for c in BENCH_COLUMNS), cells)
