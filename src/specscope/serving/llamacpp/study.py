"""llama.cpp through ``tune`` and ``bench``: llama-server's settings chosen on the tuning
prompts and checked on held-out ones.

- :func:`tune_llama_server` (``specscope tune RUN_DIR --backend llama-server``): the candidate
  settings (plain, the draft model at K, each model-free lookup; :data:`.backend.DEFAULT_CANDIDATES`)
  timed in llama-server on the measurement run's own prompts (the tuning prompts). Every
  draft-model setting, K up to ``max_k`` with and without each ``p_min``, run or not, is then
  *priced*: its tokens per step replayed from the run's records as llama-server counts them,
  over a step time: each step's passes as llama-server runs them, at llama-bench's pass costs
  (:class:`.costs.ServerStepModel`), scaled by two factors that plain's and one draft-model
  setting's requests measured here (the calibration, named in the policy file); an earlier
  tune's requests can be priced again without timing (``timings``). The model-free lookups,
  C++ that specscope does not replay, are chosen on their timings. One chooser
  (:func:`specscope.tune.engine_choice.choose`) takes the uniform best, and a domain's own best
  only where it beats the uniform one there with 95% confidence (``tune.route_tests``); the
  policy file's ``llama_server`` entries hold the exact flags and GGUF files, and ``tune.cells``
  every candidate's prediction and how it was made. The run measured another model than the
  GGUF where they differ: the output says which.
- :func:`llama_server_plan` (``specscope bench --backend llama-server --policy-file FILE``,
  through :func:`specscope.tune.study.bench`): the
  policy's candidates (and the priced setting of highest predicted speed-up, the step model's
  check) on held-out prompts (none that the run measured), every repeat on fresh servers;
  predicted against measured for every cell, each domain's regret (the chosen candidate
  against the best one measured), routed against the best single setting over the four domains'
  traffic, and whether each interval is ±5% or narrower.

Runs llama-server through :mod:`.backend`; does not build it (:mod:`.programs`) or measure
acceptance node by node (``specscope run``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from ...analysis.bench_stats import DERIVED_METHODS, BenchRun
from ...analysis.render import Column, Grid
from ...analysis.replay import (
    ALL,
    ReplayError,
    StopRule,
    estimate,
    index_records,
    replay,
    replay_counts,
    top_chain,
)
from ...cache import local_path, recorded_path
from ...errors import SpecscopeError
from ...files import inside_of, write_json, write_output
from ...hardware import machine_line
from ...models import load_tokenizer
from ...models.demo import demo_gguf
from ...prompts.domains import select_prompts
from ...prompts.items import PromptItem
from ...prompts.render import rendering_of
from ...records import ALL_DOMAINS, load_run
from ...trees import TreeShape
from ...tune.backends import Request, requests_frame
from ...tune.bench import (
    BenchCheckpoint,
    Loop,
    OutputAgreement,
    PolicyPrediction,
    RecordedOutputs,
    Route,
    bench_prompts,
    outputs_against_recorded,
    policy_predictions,
    rendered_prompts,
    run_bench,
)
from ...tune.engine_choice import PLAIN, PRICED, Cell, EngineChoice, choose, timed_cells
from ...tune.policy import Choice, PolicyFile
from ...tune.predict import REPLAY, Prediction
from ...tune.router import RuleRouter
from ...tune.study import BenchPlan
from .backend import (
    DEFAULT_CANDIDATES,
    LlamaServerBackend,
    candidate_settings,
    requests_from_frame,
)
from .costs import (
    CostGrid,
    GridOptions,
    ServerStepModel,
    ServerTimings,
    calibrate,
    gguf_quant,
    measure_grid,
    pass_costs_for,
)
from .programs import build_llama_tools
from .server import ServerSetting

Log = Callable[[str], None]


def chain(k: int) -> TreeShape | None:
    return TreeShape.chain(k) if k > 0 else None


def chain_k(shape: TreeShape | None) -> int:
    return 0 if shape is None else shape.max_depth


# --- tune ---------------------------------------------------------------------------------------------


def source_prompts(manifest: dict, per_domain: int | None, measured: bool) -> list[PromptItem]:
    """Prompts of the run's domain sources, drawn again with its seed: the run's own
    (``measured``: the tuning prompts) or ones it did not measure (held out); the first
    ``per_domain`` of each domain (None: all), the domains taking turns as in a bench
    (:func:`~specscope.tune.bench.bench_prompts`): a spec type that keeps state across requests
    (``ngram-mod``'s n-gram pool) then sees mixed traffic before each prompt in both."""
    spec = manifest.get("config", {}).get("prompts", {})
    domains = list(spec.get("domains") or [])
    if not domains or spec.get("file"):
        raise SpecscopeError(
            "tuning and held-out prompts come from the run's domain sources, but this run "
            "measured a prompts file; measure a run with --domains"
        )
    used = set(manifest.get("prompts", {}).get("ids") or [])
    seed = manifest.get("config", {}).get("seed", 42)
    wanted = spec.get("per_domain") if measured else (spec.get("per_domain") or 0) + per_domain
    items = select_prompts(domains, wanted, seed=seed, sources=dict(spec.get("sources") or ()))
    picked: dict[str, list[PromptItem]] = {}
    for item in items:
        mine = picked.setdefault(item.domain, [])
        if (item.id in used) == measured and (per_domain is None or len(mine) < per_domain):
            mine.append(item)
    turns = zip_longest(*(picked.get(d, []) for d in domains))
    return [x for row in turns for x in row if x is not None]


def held_out_prompts(manifest: dict, per_domain: int) -> list[PromptItem]:
    """``per_domain`` prompts per domain from the run's sources that the run did not measure."""
    return source_prompts(manifest, per_domain, measured=False)


def pair_tokenizer(pair: dict):
    """The tokenizer of the target a run measured (its [pair] section: a hub id at its revision)."""
    return load_tokenizer(pair.get("target", "demo:target"), revision=pair.get("target_revision"))


def draft_chain(s: ServerSetting):
    """The replay candidate a draft-model setting decodes with: the top-1 chain of K, cut by
    llama.cpp's ``p_min`` stop rule where it has one."""
    chain_of_k = top_chain(s.k)
    return StopRule(chain_of_k, p_min=s.p_min) if s.p_min else chain_of_k


def replayed_chains(run, settings: dict[str, ServerSetting]) -> dict[tuple[str, str], Prediction]:
    """(candidate, domain) -> tokens per step of each draft-model chain replayed from the run's
    records (a ``p_min`` as llama.cpp's stop rule), counted as llama-server decodes: the prefill's
    token is a step of its own. Chains deeper than the run's tree are left out."""
    out = {}
    for name, s in settings.items():
        if not s.uses_draft_model:
            continue
        try:
            result = replay(run, draft_chain(s), prefill_drafts=False)
        except SpecscopeError:
            continue  # the records hold no chain of K
        for row in result.rows:
            domain = ALL_DOMAINS if row.domain == ALL else row.domain
            e = row.tokens_per_step
            out[(name, domain)] = Prediction(e.value, e.lo, e.hi, REPLAY, prompts=row.prompts)
    return out


def draft_model_candidates(max_k: int, p_mins: Sequence[float]) -> list[str]:
    """The draft-model settings tune prices: every K up to ``max_k``, drafting all K tokens
    every step and stopped at each of ``p_mins``."""
    return [
        f"draft-simple:k={k}" + (f",p_min={p:g}" if p else "")
        for k in range(1, max_k + 1)
        for p in dict.fromkeys((0.0, *p_mins))
    ]


def calibration_setting(settings: dict[str, ServerSetting]) -> str | None:
    """The timed candidate that calibrates the step model: the first draft-model setting that
    drafts at every step (no ``p_min``)."""
    return next((n for n, s in settings.items() if s.uses_draft_model and not s.p_min), None)


def calibrated_model(
    costs_grid: CostGrid,
    settings: dict[str, ServerSetting],
    requests: Sequence[Request],
    target: Path,
    draft: Path,
) -> ServerStepModel | None:
    """The step model: the grid's pass costs for the timed settings' threads and the GGUF files'
    quantisations, scaled by plain's requests and the calibration setting's on the tuning
    prompts (None when no draft-model setting without ``p_min`` was timed)."""
    name = calibration_setting(settings)
    if name is None:
        return None
    costs = pass_costs_for(costs_grid, settings[name], gguf_quant(target), gguf_quant(draft))
    return calibrate(
        costs,
        ServerTimings.of([r for r in requests if r.method == PLAIN]),
        ServerTimings.of([r for r in requests if r.method == name]),
        {
            "setting": name,
            "prompts": "the tuning prompts (the run's)",
            "requests": sum(r.method == name for r in requests),
            "cost_grid": costs_grid.info,
        },
    )


def priced_cells(
    run,
    settings: dict[str, ServerSetting],
    model: ServerStepModel,
    timed: Sequence[Cell] = (),
) -> list[Cell]:
    """Each draft-model setting per domain and pooled: tokens per step replayed from the run's
    records as llama-server counts them (the prefill's token a step), the decode speed-up from
    the steps after the first, each priced at the passes its drafted count takes, over
    ``model``'s step time; a setting also ``timed`` keeps its timing beside (in-sample). Chains
    deeper than the run's tree are left out."""
    rec = index_records(run)
    by_key = {(c.candidate, c.domain): c for c in timed}
    out = []
    for name, s in settings.items():
        if not s.uses_draft_model:
            continue
        try:
            counts = replay_counts(rec, draft_chain(s), prefill_drafts=False)
        except ReplayError:
            continue  # the records hold no chain of K
        later = counts.after_first()
        tau = later.ratios(rec, "positions", "steps")
        mix = later.drafted_mix(rec)
        for row in estimate(rec, counts)[0].rows:
            d = row.domain
            domain = ALL_DOMAINS if d == ALL else d
            e = row.tokens_per_step
            step = (mix[d], s.k, bool(s.p_min), tau[d])
            speedup = model.predicted_speedup(*step)
            was = by_key.get((name, domain))
            out.append(
                Cell(
                    name,
                    domain,
                    row.prompts,
                    speedup,
                    speedup * e.lo / e.value,
                    speedup * e.hi / e.value,
                    Prediction(e.value, e.lo, e.hi, REPLAY, prompts=row.prompts),
                    math.nan,
                    was.exact if was else None,
                    how=PRICED,
                    timed_speedup=was.speedup if was else math.nan,
                    step_s=model.step_s(*step),
                )
            )
    return out


def outputs_against_run(runs: Sequence[BenchRun], run, n_predict: int) -> dict:
    """llama-server's plain greedy outputs against the outputs the run recorded for the same
    prompts (the measured pair's): how many are equal over the first ``n_predict`` tokens (or
    the run's max new tokens, if fewer), and where the others first differ (token index)."""
    recorded = RecordedOutputs.of([run])
    (plain,) = outputs_against_recorded(
        [r for r in runs if r.method == PLAIN],
        recorded.outputs,
        min(n_predict, recorded.max_new_tokens),
    ) or (OutputAgreement(PLAIN, 0, 0, ()),)
    return {
        "prompts": plain.prompts,
        "equal": plain.equal,
        "first_difference": list(plain.first_difference),
        "why": "llama-server runs the GGUF (quantised), another model than the pair the run "
        "measured: greedy outputs agree until the two models' top tokens first differ",
    }


def server_entry(name: str, s: ServerSetting, target: Path, draft: Path | None) -> dict:
    """What ``export --to llama.cpp`` and ``bench`` read of one candidate: the exact flags and
    the GGUF files it was timed with."""
    return {
        "candidate": name,
        "setting": s.name,
        "spec_type": s.spec_type if s.k else "none",
        "k": s.k,
        "flags": s.flags(),
        "server_setting": dataclasses.asdict(s),
        "target_gguf": recorded_path(target),
        "draft_gguf": recorded_path(draft) if s.uses_draft_model and draft else None,
    }


def _choice(cell: Cell, s: ServerSetting) -> Choice:
    tau = cell.tokens_per_step.tokens_per_step
    step = cell.step_s
    if cell.how != PRICED:  # timed: the tokens per step over the decode speed it ran at
        step = tau / (cell.speedup * cell.decode_tokens_per_s) if cell.speedup > 0 else 0.0
    shape = chain(s.k) if s.uses_draft_model else None
    return Choice(shape, cell.speedup, step, prediction=cell.tokens_per_step)


def llama_policy(
    choice: EngineChoice,
    settings: dict[str, ServerSetting],
    target: Path,
    draft: Path | None,
    source: dict,
    tune_info: dict,
) -> PolicyFile:
    """The policy file: per domain a chain of the draft model (draft-simple) or no tree (plain,
    and a lookup, which specscope's own decoder does not run: ``llama_server`` names it), the
    prediction made on the tuning prompts, and under ``llama_server`` each candidate's flags."""
    entries = {n: server_entry(n, s, target, draft) for n, s in settings.items()}

    def pick(name: str, domain: str) -> tuple[TreeShape | None, Choice]:
        c = _choice(choice.cell(name, domain), settings[name])
        return c.shape, c

    per_domain = {d: pick(n, d) for d, n in choice.per_domain.items()}
    uniform = pick(choice.uniform, ALL_DOMAINS)
    return PolicyFile(
        trees={d: shape for d, (shape, _) in per_domain.items()},
        uniform=uniform[0],
        choices={**{d: c for d, (_, c) in per_domain.items()}, ALL_DOMAINS: uniform[1]},
        info={
            "llama_server": {
                "domains": {d: entries[n] for d, n in choice.per_domain.items()},
                "fallback": entries[choice.uniform],
                "reference": entries[PLAIN],
                "candidates": entries,
            },
            "source": source,
            "tune": {
                **tune_info,
                "cells": [c.to_dict() for c in choice.cells],
                "route_tests": [t.to_dict() for t in choice.route_tests],
            },
        },
    )


@dataclass(frozen=True)
class LlamaTuneConfig:
    """What ``specscope tune RUN_DIR --backend llama-server`` times and prices: ``candidates``
    (:data:`.backend.DEFAULT_CANDIDATES`'s syntax) on ``base``'s server flags, ``per_domain`` of
    the run's prompts per domain (None: all) x ``repeats``, ``n_predict`` tokens each; every
    draft-model chain up to ``max_k``, uncut and cut at each of ``p_mins``, priced by a step
    model over ``cost_grid`` (None: measured with llama-bench); ``timings``: an earlier tune's
    ``-requests.parquet`` of these candidates on these prompts, priced and chosen again without
    timing anything (refused where it is another tune's)."""

    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    base: ServerSetting = ServerSetting()
    target_gguf: Path | None = None  # None: the demo pair's, Q4_K_M
    draft_gguf: Path | None = None
    per_domain: int | None = None
    n_predict: int = 64
    repeats: int = 1
    min_speedup: float = 1.0
    n_boot: int = 2000
    cost_grid: Path | None = None
    max_k: int = 4
    p_mins: tuple[float, ...] = (0.5, 0.75, 0.9)
    timings: Path | None = None


def tune_llama_server(
    run_dir: Path, out: Path, config: LlamaTuneConfig = LlamaTuneConfig(), log: Log = print
) -> tuple[PolicyFile, EngineChoice]:
    """Time ``config.candidates`` on the run's prompts in llama-server, price every draft-model
    setting with the step model they calibrate, and choose (module docstring); the policy goes
    to ``out``, every request to ``out``'s ``-requests.parquet`` beside it, a measured cost grid
    to its ``-costs.json``."""
    inside = inside_of(out, run_dir)  # a link planted on the way out is refused before any work
    run = load_run(run_dir)
    settings = candidate_settings(config.candidates, config.base)
    target = Path(config.target_gguf) if config.target_gguf else demo_gguf("target")
    draft = Path(config.draft_gguf) if config.draft_gguf else demo_gguf("draft")
    grid = CostGrid.load(config.cost_grid) if config.cost_grid else None
    calibration = calibration_setting(settings)
    if grid is not None and calibration is not None:  # refused now, not after the timing
        pass_costs_for(grid, settings[calibration], gguf_quant(target), gguf_quant(draft))
    measured = run.manifest.get("config", {})
    items = source_prompts(run.manifest, config.per_domain, measured=True)
    tokenizer = pair_tokenizer(measured.get("pair", {}))
    prompts = rendered_prompts(
        items, tokenizer, rendering_of(measured), measured.get("max_prompt_tokens", 512)
    )
    tools = build_llama_tools(log)
    earlier = []
    if config.timings:
        earlier = earlier_timings(config.timings, settings, items, config.n_predict, config.repeats)
    if earlier:
        log(f"{len(earlier)} requests timed before, from {config.timings}: not timed again")
    else:
        log(
            f"timing {len(settings)} llama-server settings on {len(prompts)} of the run's "
            f"prompts x {config.repeats} repeat(s), {config.n_predict} tokens each"
        )
    journal = BenchCheckpoint(
        out.with_name(out.stem + "-requests.partial.jsonl"),
        {"tune": recorded_path(run_dir), "candidates": {n: s.name for n, s in settings.items()},
         "prompts": [it.id for it in items], "n_predict": config.n_predict},
    )  # fmt: skip
    backend = LlamaServerBackend(tools, target, draft, config.n_predict)
    timed = run_bench(backend, prompts, settings, Loop(config.repeats), log, journal, earlier)
    runs, requests = timed.runs, list(timed.requests)
    write_output(
        out.with_name(out.stem + "-requests.parquet"),
        requests_frame(requests).to_parquet(None, index=False),
        inside,
    )
    journal.path.unlink(missing_ok=True)
    rec = index_records(run)  # every draft-model setting below replays it: indexed once
    model = None
    if calibration is not None:
        if grid is None:
            s = settings[calibration]
            log("llama-bench: the two models' pass costs at the timed settings ...")
            grid = measure_grid(
                tools,
                target,
                draft,
                GridOptions(
                    threads=(s.threads,),
                    polls=(s.poll,),
                    draft_threads=(s.draft_threads or s.threads,),
                    batches=((s.batch, s.ubatch),),
                    tokens=config.max_k + 1,
                ),
                log,
            )
            write_json(out.with_name(out.stem + "-costs.json"), grid.to_dict(), inside)
        model = calibrated_model(grid, settings, requests, target, draft)
    # a timed draft-model setting's replay stands beside its timing only where it is not priced
    timed = timed_cells(runs, None if model else replayed_chains(rec, settings), config.n_boot)
    cells = list(timed)
    if model is not None:
        priced = {
            **candidate_settings(draft_model_candidates(config.max_k, config.p_mins), config.base),
            **{n: x for n, x in settings.items() if x.uses_draft_model},
        }
        settings = {**settings, **priced}
        cells = [c for c in timed if not settings[c.candidate].uses_draft_model]
        cells += priced_cells(rec, priced, model, timed)
    else:
        log(
            "draft-model settings not priced: no draft-model candidate without p_min was timed "
            "to calibrate llama-server's step (they are chosen on their timings)"
        )
    choice = choose(cells, config.min_speedup, runs, config.n_boot)
    source = {
        "run_dir": recorded_path(run_dir),
        "run_id": run.manifest.get("run_id"),
        "prompt_ids": list(run.manifest.get("prompts", {}).get("ids") or []),
        "target": {
            "measured": measured.get("pair", {}),
            "timed": {"target_gguf": recorded_path(target), "draft_gguf": recorded_path(draft)},
            "note": "acceptance replayed from the run's records is the measured pair's; the "
            "GGUF files timed are another model where they differ from it (quantisation)",
        },
    }
    tune_info = {
        "backend": "llama-server",
        "tuning_prompts": [it.id for it in items],
        "n_predict": config.n_predict,
        "repeats": config.repeats,
        "min_speedup": config.min_speedup,
        "rendering": rendering_of(measured),
        "max_prompt_tokens": measured.get("max_prompt_tokens", 512),
        "machine": machine_line(),
        **({"step_model": model.to_dict()} if model else {}),
    }
    tune_info["outputs_vs_run"] = outputs_against_run(runs, run, config.n_predict)
    policy = llama_policy(choice, settings, target, draft, source, tune_info)
    policy.save(out, inside)
    return policy, choice


def earlier_timings(
    path: Path,
    settings: dict[str, ServerSetting],
    items: Sequence[PromptItem],
    n_predict: int,
    repeats: int,
) -> list[Request]:
    """The requests of an earlier tune (its ``-requests.parquet``), refused unless they are
    the requests this tune would make, every one of them."""
    import pandas as pd

    requests = requests_from_frame(pd.read_parquet(path))
    expected = {(rep, n, it.id) for rep in range(repeats) for n in settings for it in items}
    mine = [
        r
        for r in requests
        if (r.repeat, r.method, r.prompt_id) in expected and r.tokens <= n_predict
    ]
    missing = len(expected - {(r.repeat, r.method, r.prompt_id) for r in mine})
    if len(mine) < len(requests) or missing:
        raise SpecscopeError(
            f"{path} holds {len(requests)} requests: {len(requests) - len(mine)} this tune would "
            f"not make and {missing} of its {len(expected)} missing (longest output "
            f"{max((r.tokens for r in requests), default=0)} of {n_predict} tokens): give the "
            "same candidates, --tune-per-domain, --tune-repeats and --max-new-tokens, or time "
            "again"
        )
    return requests


def models_note(policy: PolicyFile) -> str:
    """Which model llama-server ran against which the run measured, and how their greedy
    outputs compare on the tuning prompts."""
    target = (policy.info.get("source") or {}).get("target", {})
    measured = target.get("measured", {})
    timed = target.get("timed", {})
    out = policy.info.get("tune", {}).get("outputs_vs_run")
    line = (
        f"llama-server ran {Path(timed.get('target_gguf', '?')).name}; the run measured "
        f"{measured.get('target', '?')} ({measured.get('quantize') or measured.get('dtype', '?')}): "
        "another model, so replayed tokens per step are the run's pair's"
    )
    if out:
        line += (
            f"; plain greedy outputs equal to the run's on {out['equal']} of {out['prompts']} "
            "tuning prompts"
        )
    return line


ONE_TUNING_REPEAT = (
    " One repeat: the intervals are over prompts only, and leave out what a freshly started "
    "server brings to all of a setting's requests; --tune-repeats 2 or more puts that in them "
    "and in the route tests."
)


def tune_grid(choice: EngineChoice, repeats: int = 1) -> Grid:
    """Every candidate per domain on the tuning prompts, the chosen one marked: the priced ones'
    predictions beside what they did in llama-server where they ran (in-sample); ``repeats``:
    the tune's, whose intervals leave out the variation between repeats when it is one."""

    def num(x: float, suffix: str = "") -> str:
        return f"{x:.2f}{suffix}" if math.isfinite(x) else "-"

    def tokens(p: Prediction | None) -> str:
        if p is None:
            return "-"
        interval = f" [{p.lo:.2f}, {p.hi:.2f}]" if math.isfinite(p.lo) else ""
        return f"{p.tokens_per_step:.2f}{interval}"

    chosen = {**choice.per_domain, ALL_DOMAINS: choice.uniform}
    rows = tuple(
        (
            c.domain,
            c.candidate + (" (chosen)" if chosen.get(c.domain) == c.candidate else ""),
            c.prompts,
            num(c.speedup, "x") + (f" [{c.lo:.2f}, {c.hi:.2f}]" if c.candidate != PLAIN else ""),
            "priced" if c.how == PRICED else "timed" if c.candidate != PLAIN else "-",
            num(c.timed_speedup, "x") if c.how == PRICED else num(c.speedup, "x"),
            tokens(c.tokens_per_step),
            tokens(c.replay) if c.how != PRICED else "(the prediction)",
            {True: "yes", False: "no", None: "not run"}[c.exact],
        )
        for c in choice.cells
    )
    return Grid(
        "llama_tune",
        "llama-server settings on the tuning prompts (the measurement run's)",
        tuple(
            Column(c)
            for c in (
                "domain",
                "candidate",
                "prompts",
                "predicted speed-up (95% CI)",
                "how",
                "timed here",
                "tokens/step (95% CI)",
                "replayed tokens/step",
                "outputs = plain",
            )
        ),
        rows,
        "speed-up: decoding after the first token against plain, in llama-server. priced: the run's "
        "records replayed as this chain decodes (the measured pair, not the GGUF) over the step "
        "model (llama-bench's pass costs, scaled by plain's and one draft-model setting's "
        "requests here); its 'timed here' is an in-sample check, not what chose. timed: what it "
        "did in llama-server on these prompts (model-free lookups, unreplayed)."
        + (ONE_TUNING_REPEAT if repeats < 2 else ""),
    )


# --- bench ----------------------------------------------------------------------------------------------


def candidate_predictions(policy: PolicyFile) -> dict[tuple[str, str], PolicyPrediction]:
    """(candidate, domain) -> its prediction on the tuning prompts, from ``tune.cells``, with
    the prompts behind it (a timed cell's are the tune's, fewer than the run's; files from
    before the prediction recorded them give the cell's)."""
    out = {}
    for i, cell in enumerate(policy.info.get("tune", {}).get("cells", [])):
        t = cell.get("tokens_per_step")
        if t:
            t = {**t, "prompts": t.get("prompts") or int(cell.get("prompts") or 0)}
        tokens = Prediction.from_dict(t, f"policy file: tune.cells[{i}]") if t else None
        speedup = cell.get("predicted_speedup")
        out[(cell["candidate"], cell["domain"])] = PolicyPrediction(
            tokens, float(speedup) if speedup is not None else math.nan
        )
    return out


def benched_candidates(policy: PolicyFile) -> list[str]:
    """The candidates a bench times: plain, every chosen one, every other candidate that is
    not dominated on the tuning prompts in every domain (dominated: its speed-up interval lies
    wholly below the interval of the domain's best candidate), and the priced setting of
    highest predicted speed-up over all the traffic, which checks the step model on held-out
    prompts even where no priced setting is chosen."""
    tuned = policy.info["tune"]["cells"]
    server = policy.info["llama_server"]
    keep = {PLAIN, server["fallback"]["candidate"]}
    keep |= {e["candidate"] for e in server["domains"].values()}
    priced = [
        c
        for c in tuned
        if c.get("how") == PRICED and c["domain"] == ALL_DOMAINS and c["predicted_speedup"]
    ]
    if priced:
        keep.add(max(priced, key=lambda c: c["predicted_speedup"])["candidate"])
    for domain in {c["domain"] for c in tuned}:
        cells = [c for c in tuned if c["domain"] == domain and c["predicted_speedup"] is not None]
        best = max(cells, key=lambda c: c["predicted_speedup"])
        best_lo = (
            best["interval"][0] if best["interval"][0] is not None else best["predicted_speedup"]
        )
        for c in cells:
            hi = c["interval"][1] if c["interval"][1] is not None else c["predicted_speedup"]
            if hi >= best_lo:
                keep.add(c["candidate"])
    return [n for n in server["candidates"] if n in keep]


def llama_server_plan(
    policy_path: Path,
    out: Path,
    domains: Sequence[str],
    per_domain: int,
    repeats: int = 3,
    n_predict: int | None = None,
    seed: int = 2026,
    in_sample: bool = False,
    n_boot: int = 2000,
    log: Log = print,
    prune: bool = True,
    earlier: Sequence[Request] = (),
) -> BenchPlan:
    """The bench of a llama-server policy (module docstring), for
    :func:`specscope.tune.study.bench`: its candidates on held-out prompts, every repeat on fresh
    servers, ``routed`` and ``uniform`` the candidates' own requests picked per prompt.
    ``earlier``: the requests of this very bench made before (its ``requests.parquet``): they
    are concluded with ``repeats`` more repeats of every request (0: nothing is timed)."""
    policy = PolicyFile.load(policy_path)
    server = policy.info.get("llama_server") or {}
    tuned = policy.info.get("tune") or {}
    if "candidates" not in server or tuned.get("backend") != "llama-server":
        raise SpecscopeError(
            f"{policy_path} was not tuned for llama-server (no llama_server candidates); make "
            "one with specscope tune RUN_DIR --backend llama-server"
        )
    entries = server["candidates"]
    settings = {n: ServerSetting.from_dict(e["server_setting"]) for n, e in entries.items()}
    target = local_path(entries[PLAIN]["target_gguf"])
    drafts = {e["draft_gguf"] for e in entries.values() if e.get("draft_gguf")}
    for path in [target, *map(local_path, drafts)]:
        if not path.is_file():
            raise SpecscopeError(f"{policy_path} names GGUF file {path}, which does not exist")
    draft = local_path(next(iter(drafts))) if drafts else None
    n_predict = n_predict or int(tuned.get("n_predict", 64))
    chosen = bench_prompts(list(domains), per_domain, seed, policy, "rules", in_sample, split=False)
    kept = benched_candidates(policy) if prune else list(settings)
    pruned = [n for n in settings if n not in kept]
    if pruned:
        log(
            "not timed (dominated on the tuning prompts in every domain, and not the step "
            f"model's check): {', '.join(pruned)}"
        )
    settings = {n: settings[n] for n in kept}
    pair = (policy.info.get("source") or {}).get("target", {}).get("measured", {})
    prompts = rendered_prompts(
        chosen.items,
        pair_tokenizer(pair),
        tuned.get("rendering", "task"),
        tuned.get("max_prompt_tokens", 512),
    )
    if repeats:
        log(
            f"timing {len(settings)} llama-server settings on {len(prompts)} held-out prompts x "
            f"{repeats} repeats, {n_predict} tokens each"
        )
    made = {(r.method, r.prompt_id) for r in earlier}
    if earlier and made != {(n, it.id) for n in settings for it in chosen.items}:
        raise SpecscopeError(
            "the earlier requests given are not this bench's (other prompts or candidates): "
            "bench again"
        )
    per_domain_choice = {d: e["candidate"] for d, e in server["domains"].items()}
    fallback = server["fallback"]["candidate"]
    methods = {
        **settings,  # routed and uniform: a route only picks a server, the same request
        "routed": Route(
            RuleRouter().classify, lambda d: settings[per_domain_choice.get(d, fallback)]
        ),
        "uniform": settings[fallback],
    }
    backend = LlamaServerBackend(build_llama_tools(log) if repeats else None, target, draft,
                                 n_predict)  # fmt: skip
    journal = BenchCheckpoint(
        out / "requests.partial.jsonl",
        {"bench": recorded_path(policy_path), "candidates": {n: s.name for n, s in settings.items()},
         "prompts": [it.id for it in chosen.items], "n_predict": n_predict},
    )  # fmt: skip
    first = 1 + max((r.repeat for r in earlier), default=-1)
    return BenchPlan(
        backend,
        methods,
        prompts,
        chosen,
        Loop(first + repeats, 0, chosen.held_out_rule),
        "llama-server on held-out prompts",
        predictions=policy_predictions(policy_path),
        candidates=candidate_predictions(policy),
        choices={d: per_domain_choice.get(d, fallback) for d in domains},
        derived=DERIVED_METHODS,
        checkpoint=journal,
        earlier=earlier,
        head={
            "backend": "llama-server",
            "policy_file": recorded_path(policy_path),
            "config": {
                "per_domain": per_domain,
                "repeats": first + repeats,
                "n_predict": n_predict,
                "seed": seed,
                "candidates": {n: s.name for n, s in settings.items()},
                "not_timed": pruned,
                "target_gguf": recorded_path(target),
                "draft_gguf": recorded_path(draft) if draft else None,
            },
        },
        tail={
            "derived": "routed and uniform are the candidates' own requests, picked per prompt "
            "by the rule router (routed) or the policy's uniform entry: a route only picks a server"
        },
        keep=None,
        n_boot=n_boot,
        tuned_on=tuned.get("machine"),
        check_machines=True,
    )
