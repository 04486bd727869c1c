"""`specscope decode`, `tune` and `bench`: speculating for real with the library's decoder."""

from __future__ import annotations

from pathlib import Path

import typer

from ..limits import (
    MAX_COUNT,
    MAX_REPEATS,
    MAX_TOKENS,
    MAX_TREE_NODES,
    MAX_TUNE_DEPTH,
    MAX_TUNE_NODES,
)
from ..records import ALL_DOMAINS
from . import options
from .app import SPECULATE, command, fail, set_threads
from .drafting import DRAFTER, EXIT_LAYER, PROMPT_LOOKUP_MAX, PROMPT_LOOKUP_MIN, drafter_config

# --- decode / tune / bench -------------------------------------------------------------------

BENCH_DOMAINS = ("code", "math", "reasoning", "chat")
BENCH_METHODS = ("plain", "assisted", "chain", "uniform", "routed")


def _decode_pair(
    draft: str | None,
    target: str | None,
    dtype: str,
    device: str,
    trust_remote_code: bool,
    int8: bool = False,
    base: dict | None = None,
    drafter=None,
):
    """Load a pair (``base``: a run's [pair] section) with command-line overrides, and the
    drafter's model if it has one (default: the draft model); remote code runs only with
    ``--trust-remote-code``, whatever the run's manifest says."""
    from ..drafters import DrafterConfig
    from ..models import PairConfig, load_pair
    from ..run.config import remote_code_from_command_line

    fields = remote_code_from_command_line(
        dict(base or {}), trust_remote_code, "the run's manifest.json"
    )
    fields.update(
        {
            k: v
            for k, v in dict(draft=draft, target=target, dtype=dtype, device=device).items()
            if v is not None
        }
    )
    if int8:
        fields["quantize"] = "int8"
        fields["dtype"] = dtype or "float32"
    # decoding passes hold a few tokens, where bfloat16 was the fastest float dtype on every CPU
    # kind timed, up to 6 tokens without bfloat16 instructions (BENCHMARKS.md, "Defaults per
    # machine"); measurement's default is "auto"
    fields.setdefault("dtype", "bfloat16")
    try:  # a ModelLoadError is reported by the command decorator
        return load_pair(PairConfig(**fields), drafter or DrafterConfig())
    except TypeError as e:  # e.g. a [pair] key that PairConfig does not have
        fail(str(e))


RECORD_SUFFIXES = (".parquet", ".csv", ".jsonl")


def _check_records(path: Path, inputs: tuple) -> None:
    """Refuse a --records path before any work: its suffix, a directory, an input, a run's file."""
    from ..files import check_output_file

    if path.suffix not in RECORD_SUFFIXES:
        fail(f"--records must end in {', '.join(RECORD_SUFFIXES)}, not {path.name!r}")
    check_output_file(path, inputs, option="--records")


def _write_records(frame, path: Path) -> None:
    """The per-step records as parquet, CSV or JSONL, written whole (missing directories made)."""
    from ..files import write_output

    if path.suffix == ".parquet":
        data = frame.to_parquet(None, index=False)
    elif path.suffix == ".csv":
        data = frame.to_csv(index=False)
    else:
        data = frame.to_json(orient="records", lines=True)
    write_output(path, data)


@command(panel=SPECULATE)
def decode(
    prompt: str | None = typer.Argument(
        None, help="The prompt (one user message); or --prompt-file."
    ),
    prompt_file: Path | None = typer.Option(
        None, "--prompt-file", help="Read the prompt from this file."
    ),
    policy: str = options.with_default(options.TREE_POLICY, "chain"),
    depth: int | None = options.TREE_DEPTH,
    top_k: int | None = options.TOP_K,
    branch: int | None = options.BRANCH,
    max_nodes: int | None = options.MAX_NODES,
    paths: str | None = options.PATHS,
    acceptance: Path | None = typer.Option(
        None,
        "--acceptance",
        help="optimal: run directory whose node records give the acceptance vector.",
    ),
    policy_file: Path | None = options.POLICY_FILE,
    domain: str | None = typer.Option(
        None,
        "--domain",
        help="With --policy-file: use this domain's tree (no routing). With --acceptance: this domain's vector (default: all).",
    ),
    temperature: float = typer.Option(0.0, help="0: greedy (lossless); > 0: speculative sampling."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1]."),
    seed: int | None = options.SEED,
    min_path_prob: float = options.MIN_PATH_PROB,
    max_new_tokens: int = options.with_default(options.MAX_NEW_TOKENS, 64),
    rendering: str | None = options.RENDERING,
    max_prompt_tokens: int = options.with_default(options.MAX_PROMPT_TOKENS, 512),
    records: Path | None = typer.Option(
        None, "--records", help="Write per-step records (.parquet, .csv or .jsonl)."
    ),
    draft: str | None = options.DRAFT,
    target: str | None = options.TARGET,
    dtype: str | None = options.DTYPE,
    device: str | None = options.DEVICE,
    trust_remote_code: bool = options.TRUST_REMOTE_CODE,
    threads: int | None = options.THREADS,
    int8: bool = options.INT8,
    drafter: str | None = DRAFTER,
    prompt_lookup_min: int | None = PROMPT_LOOKUP_MIN,
    prompt_lookup_max: int | None = PROMPT_LOOKUP_MAX,
    exit_layer: int | None = EXIT_LAYER,
) -> None:
    """Generate with real speculative decoding over a draft tree; print the text and its speed."""
    from ..decode import DecodeConfig, DecodeError, check_drafter_fits, make_decoder, steps_frame
    from ..drafters import DrafterConfig
    from ..files import read_text
    from ..prompts.render import render_prompt
    from ..records import load_run
    from ..tune.acceptance import PolicyError, acceptance_vectors
    from ..tune.policy import PolicyFile, describe, make_speculation
    from ..tune.router import RuleRouter

    if (prompt is None) == (prompt_file is None):
        fail("give a prompt, or --prompt-file (one of them)")
    if records is not None:
        _check_records(records, (prompt_file, policy_file))
    text = prompt if prompt is not None else read_text(prompt_file, DecodeError, "--prompt-file")
    config = DecodeConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=options.DEFAULT_SEED if seed is None else seed,
        min_path_prob=min_path_prob,
    )
    routed = None
    if policy_file is not None:
        policies = PolicyFile.load(policy_file)
        if domain is not None and domain not in policies.trees:
            raise PolicyError(
                f"{policy_file} has no domain {domain!r}; it has "
                f"{', '.join(policies.trees) or 'none'} (omit --domain to "
                "route by the prompt)"
            )
        routed = domain or RuleRouter().classify(text)
        spec = policies.tree_for(routed)
    else:
        vector = None
        if acceptance is not None:
            vectors = acceptance_vectors(load_run(acceptance).nodes)
            if (domain or ALL_DOMAINS) not in vectors:
                fail(f"{acceptance} has no domain {domain!r}; it has {', '.join(vectors)}")
            vector = vectors[domain or ALL_DOMAINS]
        spec = make_speculation(
            policy,
            depth=depth,
            top_k=top_k,
            branch=branch,
            max_nodes=max_nodes,
            paths=paths,
            acceptance=vector,
        )
    chosen = drafter_config(drafter, prompt_lookup_min, prompt_lookup_max, exit_layer)
    if chosen is None:  # the policy file's drafter for the domain, else the draft model
        chosen = policies.drafter_for(routed) if policy_file is not None else DrafterConfig()
    check_drafter_fits(chosen, spec)
    set_threads(threads)
    pair = _decode_pair(draft, target, dtype, device, trust_remote_code, int8, drafter=chosen)
    ids = render_prompt(
        pair.tokenizer,
        [{"role": "user", "content": text}],
        rendering or options.DECODE_RENDERING,
        max_prompt_tokens,
    ).ids
    result = make_decoder(pair).generate(ids, spec, config)
    typer.echo(pair.tokenizer.decode(result.tokens, skip_special_tokens=True))
    where = f"domain {routed}: " if routed else ""
    typer.secho(
        f"{where}{chosen.label}, {describe(spec)}\n{len(result.tokens)} tokens in {result.time_s:.2f} s "
        f"({result.tokens_per_s:.2f} tok/s), {len(result.steps)} steps, mean tau "
        f"{result.mean_tau:.2f}, stop: {result.stop_reason}",
        err=True,
        fg=typer.colors.CYAN,
    )
    if records is not None:
        _write_records(steps_frame(result), records)


def _target_record(source, pair, drafters, trust_remote_code: bool) -> dict:
    """The target a policy was tuned for and its layer count (an export checks early exits
    against it): read off the loaded pair, or off the target's config when only an early exit
    needs it; None where not known."""
    layers = None
    if pair is not None:
        layers = getattr(pair.target.model.config, "num_hidden_layers", None)
    elif source and any(d.kind == "early-exit" for d in drafters):
        from ..errors import SpecscopeError
        from ..models.load import target_layers

        try:
            layers = target_layers(source, trust_remote_code)
        except SpecscopeError:  # the export then says the exit layer is unchecked
            layers = None
    return {"model": source, "layers": layers}


@command(panel=SPECULATE)
def tune(
    run_dirs: list[Path] = typer.Argument(
        ...,
        help="Measurement runs (specscope run), one per drafter, or a sweep over drafters: their nodes give acceptance by depth and sibling rank per domain.",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Policy file to write (default: RUN_DIR/policy.json)."
    ),
    costs: Path | None = options.COSTS,
    save_costs: Path | None = typer.Option(
        None, "--save-costs", help="Also write the measured cost model here (one run)."
    ),
    max_nodes: int = options.with_default(options.MAX_NODES, 32, MAX_TUNE_NODES),
    max_depth: int = typer.Option(
        8, min=1, max=MAX_TUNE_DEPTH, help="Deepest tree considered (capped by the run's tree)."
    ),
    max_rank: int | None = typer.Option(
        None, min=1, max=MAX_TREE_NODES, help="Highest sibling rank + 1 considered."
    ),
    min_count: int = typer.Option(
        20, min=0, max=MAX_COUNT, help="Acceptance cells seen fewer times count as 0."
    ),
    min_speedup: float = typer.Option(
        1.0, min=0.0, help="Speculate only where the predicted speed-up exceeds this."
    ),
    extrapolate: bool = typer.Option(
        False,
        "--extrapolate",
        help="Depths past the run's tree reuse the deepest measured acceptance (assumes flat acceptance in depth).",
    ),
    context_len: int = typer.Option(
        256,
        min=1,
        max=MAX_TOKENS,
        help="Context length of the cost measurement (it must fit the models' positions).",
    ),
    repeats: int = options.REPEATS,
    draft: str | None = options.DRAFT,
    target: str | None = options.TARGET,
    dtype: str | None = options.DTYPE,
    device: str | None = options.DEVICE,
    trust_remote_code: bool = options.TRUST_REMOTE_CODE,
    threads: int | None = options.THREADS,
    int8: bool = options.INT8,
) -> None:
    """Pick the best drafter and tree per domain (or no speculation) from measured acceptance and
    costs measured on this hardware, for each drafter measured."""
    from rich.table import Table

    from ..console import make_console
    from ..decode import make_decoder
    from ..drafters import DrafterConfig
    from ..files import check_output_file, inside_of
    from ..records import load_run
    from ..sweep.driver import expand_run_dirs
    from ..tune.costs import CostModel, drafting_model, measure_costs
    from ..tune.policy import Measured, TuneConfig, short_name
    from ..tune.policy import tune as tune_policy

    config = TuneConfig(
        max_nodes=max_nodes,
        max_depth=max_depth,
        max_rank=max_rank,
        min_count=min_count,
        min_speedup=min_speedup,
        extrapolate=extrapolate,
    )
    dirs = expand_run_dirs(list(run_dirs))
    run_dir = dirs[0]
    if len(dirs) > 1 and (costs or save_costs):
        fail("--costs and --save-costs take one run; with several, tune measures each drafter")
    policy_path = check_output_file(out or run_dir / "policy.json", (*dirs, costs), "--out")
    if save_costs is not None:
        check_output_file(save_costs, (*dirs, costs, policy_path), "--save-costs")
    runs = [load_run(d) for d in dirs]
    drafters = [DrafterConfig(**r.manifest.get("config", {}).get("drafter", {})) for r in runs]
    targets = {r.manifest.get("config", {}).get("pair", {}).get("target") for r in runs}
    if len(targets) > 1:
        fail(f"the runs measured different targets ({', '.join(map(str, targets))}); tune one")
    model = CostModel.load(costs) if costs else None
    models = [model] if model else []
    if model is not None:  # priced only for the drafter it was timed with
        models_run = runs[0].manifest.get("models", {})
        warning = model.check_drafter(drafters[0], drafting_model(models_run, drafters[0]))
        if warning:
            typer.secho(warning, err=True, fg=typer.colors.YELLOW)
    pair = None
    if model is None:
        base = runs[0].manifest.get("config", {}).get("pair", {})
        set_threads(threads)
        own = DrafterConfig() if DrafterConfig() in drafters else drafters[0]
        pair = _decode_pair(draft, target, dtype, device, trust_remote_code, int8, base, own)
        for drafter in drafters:  # the target's passes timed once, for every drafter
            typer.echo(f"measuring {drafter.label}'s draft and verify times here ...", err=True)
            models.append(
                measure_costs(
                    make_decoder(pair, drafter),
                    context_len=context_len,
                    repeats=repeats,
                    target_costs=models[0] if models else None,
                    drafter=drafter,
                    drafter_model=drafting_model(pair.provenance, drafter),
                )
            )
        if save_costs:
            models[0].save(save_costs, inside_of(save_costs, run_dir))
    measured = [
        Measured(d, r.nodes, r.steps, m) for d, r, m in zip(drafters, runs, models, strict=True)
    ]
    run = runs[0]
    ids = run.manifest.get("prompts", {}).get("ids") or sorted(run.prompts["prompt_id"].unique())
    source = {
        "run_dir": str(run_dir),
        "run_id": run.manifest.get("run_id"),
        "prompt_ids": list(ids),
        "target": _target_record(target or next(iter(targets)), pair, drafters, trust_remote_code),
    }
    if len(runs) > 1:
        source["runs"] = [
            {"run_dir": str(d), "run_id": r.manifest.get("run_id"), "drafter": f.label}
            for d, r, f in zip(dirs, runs, drafters, strict=True)
        ]
    policy = tune_policy(measured, config, source)
    model = measured[0].costs
    path = policy.save(policy_path, inside_of(policy_path, run_dir))
    table = Table(
        title=f"best tree per domain (plain decoding: {1 / model.plain_token_s:.2f} tok/s)"
    )
    columns = (
        "domain",
        "drafter",
        "tree",
        "nodes",
        "expected tau",
        "step ms",
        "predicted speed-up",
    )
    for col in columns:
        table.add_column(col, justify="left" if col in columns[:3] else "right")
    for name, choice in policy.choices.items():
        table.add_row(
            "uniform (all)" if name == ALL_DOMAINS else name,
            choice.drafter.label if choice.shape else "-",
            short_name(choice.shape) if choice.shape else "none (plain decoding)",
            str(len(choice.shape) if choice.shape else 0),
            f"{choice.expected_tau:.2f}",
            f"{1000 * choice.step_time_s:.0f}",
            f"{choice.predicted_speedup:.2f}x",
        )
    make_console().print(table)
    typer.echo(f"wrote {path}")


@command(panel=SPECULATE)
def bench(
    policy_file: Path | None = options.POLICY_FILE,
    domains: list[str] | None = options.DOMAINS,
    per_domain: int = options.with_default(options.PER_DOMAIN, 2),
    max_new_tokens: int = options.with_default(options.MAX_NEW_TOKENS, 48),
    warmup: int = typer.Option(
        1, min=0, max=MAX_REPEATS, help="Untimed rounds of every method on the first prompt."
    ),
    repeats: int = options.REPEATS,
    chain_depth: int = typer.Option(
        4, min=1, max=MAX_TREE_NODES, help="Depth of the 'chain' method."
    ),
    min_path_prob: float = options.MIN_PATH_PROB,
    methods: list[str] | None = typer.Option(
        None,
        help="Methods to time (default plain,assisted,chain,uniform,routed; repeat the option or separate by commas): plain, assisted, chain, uniform, routed, dynamic, ngram (a chain of --chain-depth from n-gram lookup), early-exit (a chain from the target's first --exit-layer layers).",
    ),
    router_name: str = typer.Option(
        "rules",
        "--router",
        help="rules or learned (TF-IDF + logistic regression, trained on a held-out split).",
    ),
    seed: int | None = options.SEED,
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write every run and the summary as JSON."
    ),
    draft: str | None = options.DRAFT,
    target: str | None = options.TARGET,
    dtype: str | None = options.DTYPE,
    device: str | None = options.DEVICE,
    trust_remote_code: bool = options.TRUST_REMOTE_CODE,
    threads: int | None = options.THREADS,
    int8: bool = options.INT8,
    prompt_lookup_min: int | None = PROMPT_LOOKUP_MIN,
    prompt_lookup_max: int | None = PROMPT_LOOKUP_MAX,
    exit_layer: int | None = EXIT_LAYER,
) -> None:
    """Tokens per second of plain, assisted, chain, uniform-tree, routed, dynamic, ngram and
    early-exit decoding, per domain."""
    import dataclasses
    import functools

    import torch
    from rich.table import Table

    from ..console import make_console
    from ..decode import make_decoder
    from ..drafters import DrafterConfig
    from ..files import check_output_file, write_json
    from ..tune.bench import ROUTERS, BenchConfig, bench_prompts, run_bench, summarize_bench
    from ..tune.policy import PolicyFile

    if out is not None:
        check_output_file(out, (policy_file,), "--out")
    console = make_console()
    config = BenchConfig(
        max_new_tokens=max_new_tokens,
        warmup=warmup,
        repeats=repeats,
        chain_depth=chain_depth,
        min_path_prob=min_path_prob,
        methods=options.names(methods) or BENCH_METHODS,
        ngram=DrafterConfig(
            "ngram", prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max
        ),
        early_exit=None
        if exit_layer is None
        else DrafterConfig("early-exit", exit_layer=exit_layer),
    )
    policy = PolicyFile.load(policy_file) if policy_file else None
    names = list(options.names(domains) or BENCH_DOMAINS)
    if router_name not in ROUTERS:
        fail(f"--router must be one of {', '.join(ROUTERS)}, not {router_name!r}")
    seed = options.DEFAULT_SEED if seed is None else seed
    chosen = bench_prompts(names, per_domain, seed, policy, router_name)
    table = Table(title=f"router accuracy on {chosen.held_out} held-out prompts")
    for col in ["router"] + names + [ALL_DOMAINS]:
        table.add_column(col, justify="left" if col == "router" else "right")
    for rep in chosen.reports:
        table.add_row(
            rep.router,
            *(
                f"{rep.domain_accuracy(d):.1%} ({rep.per_domain.get(d, (0, 0))[1]})"
                if d in rep.per_domain
                else "-"
                for d in names
            ),
            f"{rep.accuracy:.1%}",
        )
    console.print(table)
    router, items = chosen.routers[router_name], chosen.items
    set_threads(threads)
    if config.early_exit is not None:  # the exit layer is checked before any weights load
        from ..models.load import target_layers

        config.early_exit.check_target_layers(
            target_layers(target or "demo:target", trust_remote_code)
        )
    pair = _decode_pair(draft, target, dtype, device, trust_remote_code, int8)
    runs = run_bench(
        functools.cache(lambda drafter: make_decoder(pair, drafter)),
        pair.tokenizer,
        items,
        policy,
        router,
        config,
        log=lambda line: typer.echo(line, err=True),
    )
    rows = summarize_bench(runs)
    table = Table(
        title=f"greedy decoding, {max_new_tokens} new tokens, median of {repeats} after "
        f"{warmup} warm-up; {pair.target.model.dtype}, {torch.get_num_threads()} "
        f"threads{', int8' if int8 else ''}"
    )
    for col in (
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
    ):
        table.add_column(col, justify="left" if col in ("domain", "method") else "right")
    for r in rows:
        table.add_row(
            r.domain,
            r.method,
            str(r.prompts),
            str(r.tokens),
            f"{r.decode_tokens_per_s:.2f}",
            f"{r.speedup:.2f}x"
            + (
                f" [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]" if r.speedup_lo == r.speedup_lo else ""
            ),
            f"{r.tokens_per_s:.2f}",
            f"{r.e2e_speedup:.2f}x",
            "-" if r.tau != r.tau else f"{r.tau:.2f}",
            "yes" if r.exact else "[red]no[/]",
        )
    console.print(table)
    if out is not None:
        write_json(
            out,
            {
                "config": dataclasses.asdict(config),
                "policy_file": str(policy_file or ""),
                "router": router_name,
                "dtype": str(pair.target.model.dtype),
                "int8": int8,
                "threads": torch.get_num_threads(),
                "router_accuracy": [
                    {"router": r.router, "per_domain": r.per_domain, "accuracy": r.accuracy}
                    for r in chosen.reports
                ],
                "rows": [dataclasses.asdict(r) for r in rows],
                "runs": [dataclasses.asdict(r) for r in runs],
            },
        )
        typer.echo(f"wrote {out}")
