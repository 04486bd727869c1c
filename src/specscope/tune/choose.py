"""What the speculating commands decide, as library functions: which speculation and drafter a
decode uses (:func:`choose_speculation`), the pair a decode, tune or bench loads
(:func:`decode_pair_config`, :func:`load_decode_pair`), what ``specscope tune`` tunes from
(:func:`load_tune_runs`, :func:`cost_models`, :func:`tune_source`), and the tables ``tune`` and
``bench`` show (:func:`policy_grid`, :func:`router_grid`), and the bench of the pair loaded here
(:func:`decoder_plan`, for :func:`specscope.tune.study.bench`).

The command line (``specscope.cli.speculate``) parses options into these calls and prints what
they return; this module prints nothing (``log`` callbacks carry its progress lines). It does not
choose trees itself: :mod:`specscope.tune.policy` does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..analysis.bench_stats import BenchRun
from ..analysis.render import Column, Grid
from ..cache import recorded_path
from ..drafters import DrafterConfig
from ..hardware import machine_line
from ..records import ALL_DOMAINS, Run
from ..trees import Speculation
from . import bench
from .acceptance import PolicyError
from .bench import BenchConfig, BenchPrompts
from .costs import COST_DECODE_TOKENS, CostModel
from .policy import PolicyFile
from .predict import REPLAY, Prediction, Stop
from .study import BenchPlan

Log = Callable[[str], None]
MAX_TIMED_DECODE = 128  # tokens: the longest decode a cost model times

# Decoding passes hold a few tokens, where bfloat16 was the fastest float dtype on every CPU kind
# timed, up to 6 tokens without bfloat16 instructions (BENCHMARKS.md, "Defaults per machine");
# measurement's default is "auto".
DECODE_DTYPE = "bfloat16"

# --- decode: which speculation ----------------------------------------------------------------------


@dataclass(frozen=True)
class TreeRequest:
    """A decode's tree options: a policy and its parameters, or a policy file (routed by the
    prompt's domain, or ``domain``'s), or an optimal tree from a run's acceptance."""

    policy: str = "chain"
    depth: int | None = None
    top_k: int | None = None
    branch: int | None = None
    max_nodes: int | None = None
    paths: str | None = None
    acceptance: Path | None = None  # optimal: a run whose node records give the acceptance
    policy_file: Path | None = None
    domain: str | None = None


@dataclass(frozen=True)
class Choice:
    """What a decode speculates with: the tree (or dynamic growth, or none), the drafter, the
    domain the prompt was routed to (None when no policy file routed it) and the stop rule that
    cuts the tree node by node (None: none)."""

    speculation: Speculation
    drafter: DrafterConfig
    domain: str | None
    backend: str = "specscope"  # what the policy file runs it in (BACKENDS)
    stop: Stop | None = None


def _routed(request: TreeRequest, text: str) -> tuple[PolicyFile, str]:
    from .router import RuleRouter

    policies = PolicyFile.load(request.policy_file)
    if request.domain is not None and request.domain not in policies.trees:
        raise PolicyError(
            f"{request.policy_file} has no domain {request.domain!r}; it has "
            f"{', '.join(policies.trees) or 'none'} (omit --domain to route by the prompt)"
        )
    return policies, request.domain or RuleRouter().classify(text)


def _acceptance_vector(request: TreeRequest):
    from ..records import load_run
    from .acceptance import acceptance_vectors

    if request.acceptance is None:
        return None
    vectors = acceptance_vectors(load_run(request.acceptance).nodes)
    domain = request.domain or ALL_DOMAINS
    if domain not in vectors:
        raise PolicyError(
            f"{request.acceptance} has no domain {request.domain!r}; it has {', '.join(vectors)}"
        )
    return vectors[domain]


def choose_speculation(
    request: TreeRequest, text: str, drafter: DrafterConfig | None = None
) -> Choice:
    """The speculation a decode of ``text`` uses, and its drafter: ``drafter`` when given, else
    the policy file's for the routed domain, else the draft model. Checks that the drafter can
    propose the tree (:func:`specscope.decode.check_drafter_fits`)."""
    from ..decode import check_drafter_fits
    from .policy import make_speculation

    stop = None
    if request.policy_file is not None:
        policies, domain = _routed(request, text)
        spec = policies.tree_for(domain)
        backend = policies.backend_for(domain) if drafter is None else "specscope"
        drafter, stop = drafter or policies.drafter_for(domain), policies.stop_for(domain)
    else:
        backend = "specscope"
        domain = None
        spec = make_speculation(
            request.policy,
            depth=request.depth,
            top_k=request.top_k,
            branch=request.branch,
            max_nodes=request.max_nodes,
            paths=request.paths,
            acceptance=_acceptance_vector(request),
        )
        drafter = drafter or DrafterConfig()
    check_drafter_fits(drafter, spec)
    return Choice(spec, drafter, domain, backend, stop)


# --- the pair a decode, tune or bench loads ---------------------------------------------------------


# the draft model's attention in decoding: SDPA (transformers' default here), or the row-wise
# attention that int8 measurement runs the draft on (specscope.measure.study), with which a
# decode drafts exactly the tokens the records hold
DRAFT_ATTENTIONS = ("sdpa", "rowwise")


@dataclass(frozen=True)
class PairRequest:
    """The models the command line asks for (None: the run's, else the defaults)."""

    draft: str | None = None
    target: str | None = None
    dtype: str | None = None
    device: str | None = None
    trust_remote_code: bool = False
    int8: bool = False
    draft_attention: str = "sdpa"  # one of DRAFT_ATTENTIONS
    draft_revision: str | None = None  # a hub id's branch, tag or commit
    target_revision: str | None = None

    def __post_init__(self) -> None:
        if self.draft_attention not in DRAFT_ATTENTIONS:
            raise PolicyError(
                f"--draft-attention must be one of {', '.join(DRAFT_ATTENTIONS)}, "
                f"not {self.draft_attention!r}"
            )
        if self.draft_attention == "rowwise" and not self.int8:
            raise PolicyError(
                "--draft-attention rowwise needs --int8: int8 measurement drafts on row-wise "
                "attention; in bfloat16 and float32 it drafts on SDPA, as decoding does"
            )


def decode_pair_config(request: PairRequest, base: dict | None = None):
    """The :class:`~specscope.models.PairConfig` of a run's [pair] section ``base`` (none: the
    defaults) with the request's overrides; remote code runs only when the request allows it,
    whatever the run's manifest says; no dtype given: :data:`DECODE_DTYPE`. Loads nothing."""
    from ..models import PairConfig
    from ..run.config import remote_code_from_command_line

    fields = remote_code_from_command_line(
        dict(base or {}), request.trust_remote_code, "the run's manifest.json"
    )
    given = dict(
        draft=request.draft,
        target=request.target,
        dtype=request.dtype,
        device=request.device,
        draft_revision=request.draft_revision,
        target_revision=request.target_revision,
    )
    fields.update({k: v for k, v in given.items() if v is not None})
    if request.int8:
        fields["quantize"] = "int8"
        fields["dtype"] = request.dtype or "float32"
    fields.setdefault("dtype", DECODE_DTYPE)
    try:
        return PairConfig(**fields)
    except TypeError as e:  # e.g. a [pair] key that PairConfig does not have
        raise PolicyError(f"the run's [pair] section: {e}") from None


def load_decode_pair(
    request: PairRequest, base: dict | None = None, drafter: DrafterConfig | None = None
):
    """Load the pair of :func:`decode_pair_config`, and the drafter's model if it has one
    (default: the draft model)."""
    from ..models import load_pair

    pair = load_pair(decode_pair_config(request, base), drafter or DrafterConfig())
    if request.draft_attention == "rowwise" and pair.draft is not None:
        from ..models.int8 import use_rowwise_attention

        use_rowwise_attention(pair.draft.model)
    return pair


# --- tune -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneRuns:
    """The measurement runs a tune reads, one per drafter, and the target they measured."""

    dirs: tuple[Path, ...]
    runs: tuple[Run, ...]
    drafters: tuple[DrafterConfig, ...]
    target: str | None
    target_revision: str | None = None

    @property
    def decoding_context(self) -> int:
        """The median context length of the runs' steps: the context a decode of their prompts
        spends its steps at, which a cost model is timed at (pass times grow with it)."""
        lengths = pd.concat([r.steps["context_len"] for r in self.runs])
        return int(lengths.median())

    @property
    def output_tokens(self) -> int:
        """The runs' longest output budget (``max_new_tokens``): the length of the outputs a
        tune of them predicts for, and of the decodes its cost model times (at most
        ``MAX_TIMED_DECODE``: past it the output's last steps weigh little)."""
        budget = max(r.manifest.get("config", {}).get("max_new_tokens", 0) for r in self.runs)
        return min(budget, MAX_TIMED_DECODE) or COST_DECODE_TOKENS

    def timing_text(self, tokenizer, length: int) -> list[int] | None:
        """``length`` tokens of real text to time over: the first recorded prompt whose prompt
        and output together reach ``length`` tokens, cut there (a random context is continued
        by neither model, so every draft would be refused); None where none is long enough."""
        for row in self.runs[0].prompts.itertuples():
            if not isinstance(row.prompt_text, str):  # an ingested log may record no text
                continue
            ids = tokenizer(row.prompt_text, add_special_tokens=False).input_ids
            output = getattr(row, "output_token_ids", None)
            ids += [] if output is None else [int(t) for t in output]
            if len(ids) >= length:
                return ids[:length]
        return None

    @property
    def pair_section(self) -> dict:
        """The first run's [pair] config: the pair costs are timed with by default."""
        return self.runs[0].manifest.get("config", {}).get("pair", {})


def drafter_of(run: Run) -> DrafterConfig:
    """The drafter a measurement run measured (its manifest's ``config.drafter``)."""
    return DrafterConfig(**run.manifest.get("config", {}).get("drafter", {}))


def load_tune_runs(run_dirs: Sequence[Path]) -> TuneRuns:
    """The runs (a sweep stands for its grid points) and each one's drafter; runs of different
    targets (or revisions of one) are refused (a policy is tuned for one target)."""
    from ..records import load_run
    from ..sweep.driver import expand_run_dirs

    dirs = tuple(expand_run_dirs(list(run_dirs)))
    runs = tuple(load_run(d) for d in dirs)
    configs = [r.manifest.get("config", {}) for r in runs]
    drafters = tuple(map(drafter_of, runs))
    targets = {
        (c.get("pair", {}).get("target"), c.get("pair", {}).get("target_revision")) for c in configs
    }
    if len(targets) > 1:
        from ..models.config import named

        listed = ", ".join(sorted(named(str(t), r) for t, r in targets))
        raise PolicyError(f"the runs measured different targets ({listed}); tune one")
    return TuneRuns(dirs, runs, drafters, *next(iter(targets)))


def cost_model_warning(runs: TuneRuns, model: CostModel) -> str | None:
    """A warning when a given cost model was timed for another drafter than the run's."""
    from .costs import drafting_model

    drafter = runs.drafters[0]
    models = runs.runs[0].manifest.get("models", {})
    return model.check_drafter(drafter, drafting_model(models, drafter))


def cost_models(
    pair,
    drafters: Sequence[DrafterConfig],
    context_len: int,
    repeats: int,
    log: Log,
    text: Sequence[int] | None = None,
    decode_tokens: int = COST_DECODE_TOKENS,
) -> list[CostModel]:
    """Each drafter's cost model timed here on ``pair`` (the target's passes timed once, for
    every drafter), over ``text``, decodes of ``decode_tokens`` (see
    :func:`.costs.measure_costs`); ``log`` hears which drafter is being timed."""
    from ..decode import make_decoder
    from .costs import drafting_model, measure_costs

    models: list[CostModel] = []
    for drafter in drafters:
        log(f"measuring {drafter.label}'s draft and verify times here ...")
        models.append(
            measure_costs(
                make_decoder(pair, drafter),
                context_len=context_len,
                repeats=repeats,
                target_costs=models[0] if models else None,
                drafter=drafter,
                drafter_model=drafting_model(pair.provenance, drafter),
                text=text,
                decode_tokens=decode_tokens,
            )
        )
    return models


def timing_drafter(drafters: Sequence[DrafterConfig]) -> DrafterConfig:
    """The drafter whose model a tune loads with the pair: the draft model where one was
    measured, else the first run's drafter."""
    return DrafterConfig() if DrafterConfig() in drafters else drafters[0]


def target_record(
    source: str | None, revision: str | None, pair, drafters, trust_remote_code: bool
) -> dict:
    """The target a policy was tuned for (a hub id at ``revision``) and its layer count (an
    export checks early exits against it): read off the loaded pair, or off the target's config
    when only an early exit needs it; None where not known."""
    from ..errors import SpecscopeError

    layers = None
    if pair is not None:
        layers = getattr(pair.target.model.config, "num_hidden_layers", None)
    elif source and any(d.kind == "early-exit" for d in drafters):
        from ..models.load import target_layers

        try:
            layers = target_layers(source, trust_remote_code, revision)
        except SpecscopeError:  # the export then says the exit layer is unchecked
            layers = None
    return {"model": source, "revision": revision, "layers": layers}


def tune_source(runs: TuneRuns, target: dict) -> dict:
    """What a policy file records of what it was tuned from: the first run, its prompts (bench
    holds them out), the target, and with several runs each run's drafter."""

    def prompt_ids(run) -> list:
        return list(
            run.manifest.get("prompts", {}).get("ids") or sorted(run.prompts["prompt_id"].unique())
        )

    run = runs.runs[0]
    source = {
        "run_dir": recorded_path(runs.dirs[0]),
        "run_id": run.manifest.get("run_id"),
        "prompt_ids": prompt_ids(run),
        "target": target,
    }
    if len(runs.runs) > 1:  # each run's prompts too: the bench holds out every tuning prompt
        source["runs"] = [
            {
                "run_dir": recorded_path(d),
                "run_id": r.manifest.get("run_id"),
                "drafter": f.label,
                "prompt_ids": prompt_ids(r),
            }
            for d, r, f in zip(runs.dirs, runs.runs, runs.drafters, strict=True)
        ]
    return source


def _tokens_per_step(p: Prediction | None) -> tuple[str, str]:
    """A prediction's decoded tokens per step with its interval, and how it was predicted."""
    if p is None:
        return "1.00", "-"
    interval = f" [{p.lo:.2f}, {p.hi:.2f}]" if math.isfinite(p.lo) else ""
    return f"{p.tokens_per_step:.2f}{interval}", "replayed" if p.method == REPLAY else p.method


def policy_grid(policy: PolicyFile, plain_token_s: float) -> Grid:
    """The best tree and stop rule per domain a tune chose, with its prediction."""
    from .policy import short_name

    rows = tuple(
        (
            "uniform (all)" if name == ALL_DOMAINS else name,
            choice.drafter.label if choice.shape else "-",
            choice.backend if choice.shape else "-",
            short_name(choice.shape) if choice.shape else "none (plain decoding)",
            len(choice.shape) if choice.shape else 0,
            choice.stop.label if choice.stop else "-",
            *_tokens_per_step(choice.prediction),
            f"{1000 * choice.step_time_s:.0f}",
            f"{choice.predicted_speedup:.2f}x",
        )
        for name, choice in policy.choices.items()
    )
    columns = ("domain", "drafter", "backend", "tree", "nodes", "stop", "tokens/step (95% CI)")
    return Grid(
        "policy",
        f"best tree per domain (plain decoding: {1 / plain_token_s:.2f} tok/s)",
        tuple(Column(c) for c in (*columns, "predicted", "step ms", "predicted speed-up")),
        rows,
    )


def kinds_grid(policy: PolicyFile) -> Grid | None:
    """The kinds of policy tune weighed (:func:`.policy.policy_kinds`): predicted speed-up over
    plain per domain and for mixed traffic; None for a file without them."""
    kinds = policy.info.get("kinds")
    if not kinds:
        return None
    columns = list(next(iter(kinds.values())))
    return Grid(
        "kinds",
        "per-domain budget against per-node stop rule (predicted speed-up over plain)",
        tuple(Column(c) for c in ("policy", *columns)),
        tuple((k, *(f"{v[c]:.2f}x" for c in columns)) for k, v in kinds.items()),
    )


def backend_grid(policy: PolicyFile) -> Grid | None:
    """Per domain and backend, the chain of best predicted speed-up among the policy's
    ``candidates`` (None: candidates from one backend only)."""
    from .policy import parse_backend, parse_drafter, parse_tree, short_name

    best: dict[tuple[str, str], dict] = {}
    for entry in policy.info.get("candidates") or ():
        key = (str(entry["domain"]), parse_backend(entry, "candidates"))
        if key not in best or entry["predicted_speedup"] > best[key]["predicted_speedup"]:
            best[key] = entry
    backends = list(dict.fromkeys(b for _, b in best))
    if len(backends) < 2:
        return None
    domains = list(dict.fromkeys(d for d, _ in best))

    def cell(domain: str, backend: str) -> str:
        entry = best.get((domain, backend))
        if entry is None:
            return "-"
        drafter = parse_drafter(entry, "candidates").label
        tree = short_name(parse_tree(entry, "candidates"))
        return f"{entry['predicted_speedup']:.2f}x ({drafter} {tree})"

    return Grid(
        "backends",
        "best chain per domain and backend (predicted speed-up over plain)",
        tuple(Column(c) for c in ("domain", *backends)),
        tuple(
            ("uniform (all)" if d == ALL_DOMAINS else d, *(cell(d, b) for b in backends))
            for d in domains
        ),
    )


# --- bench ------------------------------------------------------------------------------------------


def router_grid(chosen: BenchPrompts, domains: Sequence[str]) -> Grid:
    """Each router's accuracy per domain on the held-out prompts."""
    rows = tuple(
        (
            rep.router,
            *(
                f"{rep.domain_accuracy(d):.1%} ({rep.per_domain.get(d, (0, 0))[1]})"
                if d in rep.per_domain
                else "-"
                for d in domains
            ),
            f"{rep.accuracy:.1%}",
        )
        for rep in chosen.reports
    )
    return Grid(
        "router_accuracy",
        f"router accuracy on {chosen.held_out} "
        f"{'tuning' if chosen.tuning_only else 'held-out'} prompts",
        tuple(Column(c) for c in ("router", *domains, ALL_DOMAINS)),
        rows,
    )


@dataclass(frozen=True)
class BenchSetting:
    """How a bench ran, as its record names it."""

    policy_file: Path | None
    router: str
    dtype: str
    int8: bool
    threads: int
    draft_attention: str = "sdpa"


def decoder_plan(
    decoder_for: bench.DecoderFor,
    tokenizer,
    chosen: BenchPrompts,
    policy: PolicyFile | None,
    config: BenchConfig,
    setting: BenchSetting,
    out: Path | None = None,
) -> BenchPlan:
    """The bench of specscope's decoder beside transformers' plain and assisted generation on
    the pair loaded here (:func:`.bench.decoder_methods`): the policy's predictions, its choice
    per domain, the in-sample outputs against the tuning runs', and with ``out`` a checkpoint
    beside it (``OUT.partial.jsonl``: the same command resumes)."""
    head = {
        "config": dataclasses.asdict(config),
        "policy_file": str(setting.policy_file or ""),
        "router": setting.router,
        "dtype": setting.dtype,
        "int8": setting.int8,
        "threads": setting.threads,
        "draft_attention": setting.draft_attention,
        "machine": machine_line(),
        "router_accuracy": [
            {"router": r.router, "per_domain": r.per_domain, "accuracy": r.accuracy}
            for r in chosen.reports
        ],
    }
    checkpoint = None
    if out is not None:
        checkpoint = bench.BenchCheckpoint(
            out.with_name(out.name + ".partial.jsonl"),
            {**head, "rows": [], "runs": [], "prompts": [item.id for item in chosen.items]},
        )
    domains = list(dict.fromkeys(it.domain for it in chosen.items))
    title = (
        f"greedy decoding, {config.max_new_tokens} new tokens, median of {config.repeats} after "
        f"{config.warmup} warm-up; {setting.dtype}, {setting.threads} threads"
        f"{', int8' if setting.int8 else ''}"
        f"{', the draft on row-wise attention' if setting.draft_attention == 'rowwise' else ''}"
    )
    return BenchPlan(
        bench.decoder_backend(decoder_for, config),
        bench.decoder_methods(policy, chosen.routers[setting.router], config),
        bench.rendered_prompts(chosen.items, tokenizer, config.rendering, config.max_prompt_tokens),
        chosen,
        bench.Loop(config.repeats, config.warmup, chosen.held_out_rule),
        title,
        predictions=bench.policy_predictions(setting.policy_file) if setting.policy_file else {},
        candidates=bench.candidate_predictions(policy, config) if policy else {},
        routed=bench.routed_predictions(policy, setting.router) if policy else {},
        choices=bench.policy_choices(policy, config, domains) if policy else None,
        checkpoint=checkpoint,
        head=head,
        agreement=lambda runs: outputs_vs_run(policy, runs, config.max_new_tokens),
    )


def outputs_vs_run(
    policy: PolicyFile | None, runs: Sequence[BenchRun], max_new_tokens: int
) -> tuple[bench.OutputAgreement, ...]:
    """Every method's greedy outputs on the in-sample prompts against the outputs the policy's
    tuning runs recorded for them (the measurement's trajectories): the same pair and dtype
    give the same output, or the first difference is shown."""
    recorded = bench.RecordedOutputs.of(bench.policy_runs(policy))
    mine = [r for r in runs if r.in_sample]
    cut = min(max_new_tokens, recorded.max_new_tokens)
    return bench.outputs_against_recorded(mine, recorded.outputs, cut)
