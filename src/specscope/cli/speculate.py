"""`specscope decode`, `tune` and `bench`: speculating for real with the library's decoder."""

from __future__ import annotations

import functools
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
from . import options
from .app import SPECULATE, command, fail, print_grids, set_threads
from .drafting import drafter_config

# --- decode / tune / bench -------------------------------------------------------------------


BENCH_DOMAINS = ("code", "math", "reasoning", "chat")  # the paper's four


def _pair_request(**fields):
    """The :class:`~specscope.tune.choose.PairRequest` of a command's model options."""
    from ..tune.choose import PairRequest

    return PairRequest(**fields)


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
        None,
        "--prompt-file",
        help="Read the prompt from this file.",
        rich_help_panel=options.PROMPTS_PANEL,
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
        rich_help_panel=options.TREE,
    ),
    policy_file: Path | None = options.POLICY_FILE,
    domain: str | None = typer.Option(
        None,
        "--domain",
        help="With --policy-file: use this domain's tree (no routing). With --acceptance: this domain's vector (default: all).",
        rich_help_panel=options.TREE,
    ),
    temperature: float = typer.Option(
        0.0,
        help="0: greedy (lossless); > 0: speculative sampling.",
        rich_help_panel=options.PROMPTS_PANEL,
    ),
    top_p: float = typer.Option(
        1.0, help="Nucleus sampling mass, in (0, 1].", rich_help_panel=options.PROMPTS_PANEL
    ),
    seed: int | None = options.SEED,
    min_path_prob: float = options.MIN_PATH_PROB,
    p_min: float = typer.Option(
        0.0,
        "--p-min",
        min=0.0,
        max=1.0,
        help="Greedy static trees and chains: do not draft a node whose draft probability is below this, nor its descendants (llama.cpp's --spec-draft-p-min; 0: off, or the policy file's stop rule).",
        rich_help_panel=options.TREE,
    ),
    max_new_tokens: int = options.with_default(options.MAX_NEW_TOKENS, 64),
    rendering: str | None = options.RENDERING,
    max_prompt_tokens: int = options.with_default(options.MAX_PROMPT_TOKENS, 512),
    records: Path | None = typer.Option(
        None,
        "--records",
        help="Write per-step records (.parquet, .csv or .jsonl).",
        rich_help_panel=options.OUTPUT,
    ),
    draft: str | None = options.DRAFT,
    target: str | None = options.TARGET,
    draft_revision: str | None = options.DRAFT_REVISION,
    target_revision: str | None = options.TARGET_REVISION,
    dtype: str | None = options.DTYPE,
    device: str | None = options.DEVICE,
    trust_remote_code: bool = options.TRUST_REMOTE_CODE,
    threads: int | None = options.THREADS,
    int8: bool = options.INT8,
    draft_attention: str = options.DRAFT_ATTENTION,
    drafter: str | None = options.DRAFTER,
    prompt_lookup_min: int | None = options.PROMPT_LOOKUP_MIN,
    prompt_lookup_max: int | None = options.PROMPT_LOOKUP_MAX,
    ngram_size: int | None = options.NGRAM_SIZE,
    exit_layer: int | None = options.EXIT_LAYER,
) -> None:
    """Generate with real speculative decoding over a draft tree; print the text and its speed."""
    from ..decode import DecodeConfig, DecodeError, make_decoder, steps_frame, tokens_per_step
    from ..files import read_text
    from ..prompts.render import check_rendering, render_prompt
    from ..tune.choose import TreeRequest, choose_speculation, load_decode_pair
    from ..tune.policy import describe
    from ..tune.predict import Stop

    if (prompt is None) == (prompt_file is None):
        fail("give a prompt, or --prompt-file (one of them)")
    if records is not None:
        _check_records(records, (prompt_file, policy_file))
    text = prompt if prompt is not None else read_text(prompt_file, DecodeError, "--prompt-file")
    rendering = check_rendering(rendering or options.DECODE_RENDERING)  # before loading models
    config = DecodeConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=options.DEFAULT_SEED if seed is None else seed,
        min_path_prob=min_path_prob,
    )
    tree = TreeRequest(
        policy, depth, top_k, branch, max_nodes, paths, acceptance, policy_file, domain
    )
    drafter_given = drafter_config(
        drafter, prompt_lookup_min, prompt_lookup_max, ngram_size, exit_layer
    )
    choice = choose_speculation(tree, text, drafter_given)
    set_threads(threads)
    pair = load_decode_pair(
        _pair_request(
            draft=draft,
            target=target,
            draft_revision=draft_revision,
            target_revision=target_revision,
            dtype=dtype,
            device=device,
            trust_remote_code=trust_remote_code,
            int8=int8,
            draft_attention=draft_attention,
        ),
        drafter=choice.drafter,
    )
    messages = [{"role": "user", "content": text}]
    rendered = render_prompt(pair.tokenizer, messages, rendering, max_prompt_tokens)
    stop = Stop("p_draft", p_min) if p_min else choice.stop
    stop_args = stop.decode_args if stop else {}
    result = make_decoder(pair).generate(rendered.ids, choice.speculation, config, **stop_args)
    typer.echo(pair.tokenizer.decode(result.tokens, skip_special_tokens=True))
    where = f"domain {choice.domain}: " if choice.domain else ""
    cut = f", stop {stop.label}" if stop else ""
    typer.secho(
        f"{where}{choice.drafter.label}, {describe(choice.speculation)}{cut}\n{len(result.tokens)} "
        f"tokens in {result.time_s:.2f} s ({result.tokens_per_s:.2f} tok/s), "
        f"{len(result.steps)} steps, {tokens_per_step(result):.2f} tokens per step (mean tau "
        f"{result.mean_tau:.2f}), stop: {result.stop_reason}",
        err=True,
        fg=typer.colors.CYAN,
    )
    if choice.backend != "specscope":
        typer.secho(
            f"the policy runs this chain in {choice.backend} (assisted generation), where tune "
            "predicted it fastest; decode ran it in specscope's decoder: the same greedy output, "
            "not the speed predicted (specscope bench --assisted-tokens times both)",
            err=True,
            fg=typer.colors.YELLOW,
        )
    if records is not None:
        _write_records(steps_frame(result), records)


@command(panel=SPECULATE)
def tune(
    run_dirs: list[Path] = typer.Argument(
        ...,
        help="Measurement runs (specscope run), one per drafter, or a sweep over drafters: their nodes give acceptance by depth and sibling rank per domain.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Policy file to write (default: RUN_DIR/policy.json).",
        rich_help_panel=options.OUTPUT,
    ),
    costs: Path | None = options.COSTS,
    save_costs: Path | None = typer.Option(
        None,
        "--save-costs",
        help="Also write the measured cost model here (one run).",
        rich_help_panel=options.OUTPUT,
    ),
    max_nodes: int = options.with_default(options.MAX_NODES, 32, MAX_TUNE_NODES),
    max_depth: int = typer.Option(
        8,
        min=1,
        max=MAX_TUNE_DEPTH,
        help="Deepest tree considered (capped by the run's tree).",
        rich_help_panel=options.TREE,
    ),
    max_rank: int | None = typer.Option(
        None,
        min=1,
        max=MAX_TREE_NODES,
        help="Highest sibling rank + 1 considered.",
        rich_help_panel=options.TREE,
    ),
    min_count: int = typer.Option(
        20,
        min=0,
        max=MAX_COUNT,
        help="Acceptance cells seen fewer times count as 0.",
        rich_help_panel=options.TREE,
    ),
    min_speedup: float = options.MIN_SPEEDUP,
    extrapolate: bool = typer.Option(
        False,
        "--extrapolate",
        help="Depths past the run's tree reuse the deepest measured acceptance (assumes flat acceptance in depth).",
        rich_help_panel=options.TREE,
    ),
    context_len: int | None = typer.Option(
        None,
        min=1,
        max=MAX_TOKENS,
        help="Context length of the cost measurement (it must fit the models' positions); default: the median context of the runs' steps, where decoding them spends its time.",
        rich_help_panel=options.EXECUTION,
    ),
    repeats: int = options.REPEATS,
    draft: str | None = options.DRAFT,
    target: str | None = options.TARGET,
    draft_revision: str | None = options.DRAFT_REVISION,
    target_revision: str | None = options.TARGET_REVISION,
    dtype: str | None = options.DTYPE,
    device: str | None = options.DEVICE,
    trust_remote_code: bool = options.TRUST_REMOTE_CODE,
    threads: int | None = options.THREADS,
    int8: bool = options.INT8,
    backend: str = typer.Option(
        "specscope",
        metavar=options.one_of(options.TUNE_BACKENDS),
        help="What the policy is for: specscope (specscope's decoder and transformers' assisted generation on the pair loaded here) or llama-server (its settings timed on RUN_DIR's prompts, draft-model chains priced from RUN_DIR's records; --out default RUN_DIR/llamacpp/policy.json; then bench --backend llama-server).",
        rich_help_panel=options.ENGINE_PANEL,
    ),
    candidates: list[str] = options.CANDIDATE,
    target_gguf: Path | None = options.TARGET_GGUF,
    draft_gguf: Path | None = options.DRAFT_GGUF,
    tune_per_domain: int | None = options.TUNE_PER_DOMAIN,
    tune_repeats: int = options.TUNE_REPEATS,
    server_threads: int = options.SERVER_THREADS,
    cost_grid: Path | None = options.COST_GRID,
    max_k: int = options.MAX_K,
    p_mins: list[float] = options.PRICE_P_MIN,
    tune_timings: Path | None = options.TUNE_TIMINGS,
    max_new_tokens: int = options.with_default(options.MAX_NEW_TOKENS, 64),
    n_boot: int = options.BOOT,
) -> None:
    """Pick the best drafter and tree per domain (or no speculation) from measured acceptance and
    costs measured on this hardware, for each drafter measured; with --backend llama-server,
    llama-server's settings per domain."""
    from ..files import check_output_file, inside_of
    from ..tune import choose
    from ..tune.costs import CostModel
    from ..tune.policy import Measured, TuneConfig
    from ..tune.policy import tune as tune_policy
    from ..tune.routed import prompt_texts

    if backend not in options.TUNE_BACKENDS:
        fail(f"--backend must be one of {', '.join(options.TUNE_BACKENDS)}, not {backend!r}")
    if backend == "llama-server":
        if len(run_dirs) != 1:
            fail("--backend llama-server tunes from one measurement run")
        if costs or save_costs:
            fail(
                "--costs and --save-costs are specscope's decoder's cost model; llama-server's "
                "step model is priced from --cost-grid (llama-bench's pass costs)"
            )
        out = out or run_dirs[0] / "llamacpp" / "policy.json"
        return tune_on_llama_server(
            run_dirs[0], out, candidates, target_gguf, draft_gguf, tune_per_domain, tune_repeats,
            server_threads, cost_grid, max_k, p_mins, tune_timings, max_new_tokens, min_speedup,
            n_boot,
        )  # fmt: skip
    config = TuneConfig(
        max_nodes=max_nodes,
        max_depth=max_depth,
        max_rank=max_rank,
        min_count=min_count,
        min_speedup=min_speedup,
        extrapolate=extrapolate,
    )
    runs = choose.load_tune_runs(run_dirs)
    run_dir = runs.dirs[0]
    if len(runs.dirs) > 1 and (costs or save_costs):
        fail("--costs and --save-costs take one run; with several, tune measures each drafter")
    policy_path = check_output_file(out or run_dir / "policy.json", (*runs.dirs, costs), "--out")
    if save_costs is not None:
        check_output_file(save_costs, (*runs.dirs, costs, policy_path), "--save-costs")
    pair = None
    if costs is not None:  # priced only for the drafter it was timed with
        models = [CostModel.load(costs)]
        if warning := choose.cost_model_warning(runs, models[0]):
            typer.secho(warning, err=True, fg=typer.colors.YELLOW)
    else:
        set_threads(threads)
        pair = choose.load_decode_pair(
            _pair_request(
                draft=draft,
                target=target,
                draft_revision=draft_revision,
                target_revision=target_revision,
                dtype=dtype,
                device=device,
                trust_remote_code=trust_remote_code,
                int8=int8,
            ),
            runs.pair_section,
            choose.timing_drafter(runs.drafters),
        )
        log = functools.partial(typer.echo, err=True)
        context = context_len or runs.decoding_context
        text = runs.timing_text(pair.tokenizer, context)
        models = choose.cost_models(
            pair, runs.drafters, context, repeats, log, text, runs.output_tokens
        )
        if save_costs:
            models[0].save(save_costs, inside_of(save_costs, run_dir))
    measured = [
        Measured(d, r.nodes, r.steps, m, prompt_texts(r.prompts))
        for d, r, m in zip(runs.drafters, runs.runs, models, strict=True)
    ]
    tuned_for = choose.target_record(
        target or runs.target,
        target_revision or runs.target_revision,
        pair,
        runs.drafters,
        trust_remote_code,
    )
    policy = tune_policy(measured, config, choose.tune_source(runs, tuned_for))
    path = policy.save(policy_path, inside_of(policy_path, run_dir))
    grids = [choose.policy_grid(policy, measured[0].costs.plain_token_s)]
    grids += filter(None, [choose.kinds_grid(policy), choose.backend_grid(policy)])
    print_grids(grids, blank=False)
    typer.echo(f"wrote {path}")


def tune_on_llama_server(
    run_dir, out, candidates, target_gguf, draft_gguf, tune_per_domain, tune_repeats,
    server_threads, cost_grid, max_k, p_mins, tune_timings, max_new_tokens, min_speedup, n_boot,
) -> None:  # fmt: skip
    """``tune --backend llama-server`` (and ``llamacpp``'s tune): the policy, its table, the
    route tests and which model llama-server ran against the run's."""
    from ..files import check_output_file
    from ..serving.llamacpp.server import ServerSetting
    from ..serving.llamacpp.study import (
        DEFAULT_CANDIDATES,
        LlamaTuneConfig,
        models_note,
        tune_grid,
        tune_llama_server,
    )

    out = check_output_file(out, (run_dir,), "--out")
    config = LlamaTuneConfig(
        candidates=tuple(candidates or DEFAULT_CANDIDATES),
        base=ServerSetting(threads=server_threads),
        target_gguf=target_gguf,
        draft_gguf=draft_gguf,
        per_domain=tune_per_domain,
        n_predict=max_new_tokens,
        repeats=tune_repeats,
        min_speedup=min_speedup,
        n_boot=n_boot,
        cost_grid=cost_grid,
        max_k=max_k,
        p_mins=tuple(p_mins),
        timings=tune_timings,
    )
    policy, choice = tune_llama_server(
        run_dir, out, config, functools.partial(typer.echo, err=True)
    )
    print_grids([tune_grid(choice, tune_repeats)], blank=False)
    for test in choice.route_tests:
        typer.echo(test.sentence)
    typer.echo(models_note(policy))
    typer.echo(f"wrote {out}")


@command(panel=SPECULATE)
def bench(
    backend: str = typer.Option(
        "specscope",
        metavar=options.one_of(options.BENCH_BACKENDS),
        help="What is timed: specscope (the pair loaded here: specscope's decoder beside transformers' plain and assisted generation), llama-server (the llama-server policy's candidates, spawned from its GGUF files, each repeat on fresh servers; --out is then a directory, default the policy's), openai (OpenAI-compatible servers already running at --url).",
        rich_help_panel=options.EXECUTION,
    ),
    urls: list[str] = typer.Option(
        [],
        "--url",
        help="With --backend openai: NAME=URL of a running vLLM, SGLang or llama-server (repeat the option; one named plain is the reference), e.g. plain=http://localhost:8001.",
        rich_help_panel=options.EXECUTION,
    ),
    policy_file: Path | None = options.POLICY_FILE,
    domains: list[str] | None = options.DOMAINS,
    per_domain: int = options.with_default(options.PER_DOMAIN, 2),
    max_new_tokens: int | None = options.MAX_NEW_TOKENS,
    warmup: int = typer.Option(
        1,
        min=0,
        max=MAX_REPEATS,
        help="Untimed rounds of every method on the first prompt.",
        rich_help_panel=options.EXECUTION,
    ),
    repeats: int = options.REPEATS,
    chain_depth: int = typer.Option(
        4,
        min=1,
        max=MAX_TREE_NODES,
        help="Depth of the 'chain' method.",
        rich_help_panel=options.TREE,
    ),
    min_path_prob: float = options.MIN_PATH_PROB,
    assisted_tokens: int | None = typer.Option(
        None,
        min=1,
        max=MAX_TREE_NODES,
        help="The 'assisted' method drafts a chain of this many tokens per step (transformers' constant schedule, no confidence stop: what tune predicts); default: transformers' own (up to 20, stopped by a confidence threshold it re-fits), which nothing predicts.",
        rich_help_panel=options.TREE,
    ),
    methods: list[str] | None = typer.Option(
        None,
        help="Methods to time (default plain,assisted,chain,uniform,routed; repeat the option or separate by commas): plain, assisted, chain, uniform, routed, dynamic, ngram (a chain of --chain-depth from n-gram lookup), early-exit (a chain from the target's first --exit-layer layers).",
        rich_help_panel=options.EXECUTION,
    ),
    router_name: str = typer.Option(
        "rules",
        "--router",
        metavar=options.one_of(options.ROUTERS),
        help="rules or learned (TF-IDF + logistic regression, trained on a held-out split).",
        rich_help_panel=options.PROMPTS_PANEL,
    ),
    in_sample: bool = options.IN_SAMPLE,
    tuning_prompts: bool = options.TUNING_PROMPTS,
    seed: int | None = options.SEED,
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Write every run and the summary as JSON.",
        rich_help_panel=options.OUTPUT,
    ),
    draft: str | None = options.DRAFT,
    target: str | None = options.TARGET,
    draft_revision: str | None = options.DRAFT_REVISION,
    target_revision: str | None = options.TARGET_REVISION,
    dtype: str | None = options.DTYPE,
    device: str | None = options.DEVICE,
    trust_remote_code: bool = options.TRUST_REMOTE_CODE,
    threads: int | None = options.THREADS,
    int8: bool = options.INT8,
    draft_attention: str = options.DRAFT_ATTENTION,
    prompt_lookup_min: int | None = options.PROMPT_LOOKUP_MIN,
    prompt_lookup_max: int | None = options.PROMPT_LOOKUP_MAX,
    exit_layer: int | None = options.EXIT_LAYER,
) -> None:
    """Tokens per second of plain, assisted, chain, uniform-tree, routed, dynamic, ngram and
    early-exit decoding, per domain."""
    from ..files import check_output_file, inside_of
    from ..tune.bench import BACKENDS, ROUTERS

    if backend not in BACKENDS:
        fail(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    names = list(options.names(domains) or BENCH_DOMAINS)
    if seed is None:  # llama-server's benches draw their held-out prompts with their own seed
        seed = 2026 if backend == "llama-server" else options.DEFAULT_SEED
    log = functools.partial(typer.echo, err=True)
    inside = None
    if backend == "llama-server":
        from ..serving.llamacpp.study import llama_server_plan

        if policy_file is None:
            fail("--backend llama-server benches a llama-server policy: give --policy-file")
        out = out or policy_file.parent
        inside = inside_of(out, policy_file.parent)  # links refused before any work
        plan = llama_server_plan(policy_file, out, names, per_domain, repeats, max_new_tokens,
                                 seed, in_sample, log=log)  # fmt: skip
    elif backend == "openai":
        from ..serving.openai_server import openai_plan

        if out is not None:
            check_output_file(out, (policy_file,), "--out")
        plan = openai_plan(urls, policy_file, names, per_domain, max_new_tokens or 48, repeats,
                           seed, in_sample, target)  # fmt: skip
    else:
        if router_name not in ROUTERS:
            fail(f"--router must be one of {', '.join(ROUTERS)}, not {router_name!r}")
        if out is not None:
            check_output_file(out, (policy_file,), "--out")
        from ..drafters import DrafterConfig
        from ..tune.bench import BenchConfig

        config = BenchConfig(
            max_new_tokens=max_new_tokens or 48,
            warmup=warmup,
            repeats=repeats,
            chain_depth=chain_depth,
            min_path_prob=min_path_prob,
            assisted_tokens=assisted_tokens,
            methods=options.names(methods) or BenchConfig.methods,
            ngram=DrafterConfig(
                "ngram", prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max
            ),
            early_exit=None
            if exit_layer is None
            else DrafterConfig("early-exit", exit_layer=exit_layer),
        )
        request = _pair_request(
            draft=draft,
            target=target,
            draft_revision=draft_revision,
            target_revision=target_revision,
            dtype=dtype,
            device=device,
            trust_remote_code=trust_remote_code,
            int8=int8,
            draft_attention=draft_attention,
        )
        plan = _decoder_plan(config, request, names, per_domain, seed, policy_file, router_name,
                             in_sample, tuning_prompts, threads, out)  # fmt: skip
    run_plan(plan, out, inside)


def run_plan(plan, out: Path | None, inside: Path | None = None) -> None:
    """Bench ``plan`` (:func:`specscope.tune.study.bench`), print its tables and notes, and
    write its record to ``out``."""
    from ..tune import study

    result = study.bench(plan, functools.partial(typer.echo, err=True))
    print_grids(result.grids, blank=False)
    for note in result.notes:
        typer.echo(note)
    if out is not None:
        typer.echo(f"wrote {study.save(plan, result, out, inside)}")


def _decoder_plan(
    config, request, names, per_domain, seed, policy_file, router_name, in_sample,
    tuning_prompts, threads, out,
):  # fmt: skip
    """``bench``'s plan for the pair ``request`` names: specscope's decoder beside transformers."""
    import torch

    from ..decode import make_decoder
    from ..tune import choose
    from ..tune.bench import bench_prompts
    from ..tune.policy import PolicyFile

    policy = PolicyFile.load(policy_file) if policy_file else None
    if tuning_prompts and policy is None:
        fail("--tuning-prompts needs --policy-file: the policy's tuning runs name the prompts")
    chosen = bench_prompts(
        names,
        per_domain,
        seed,
        policy,
        router_name,
        in_sample,
        split=router_name != "rules",  # only the learned router trains, on half of them
        tuning_only=tuning_prompts,
    )
    print_grids([choose.router_grid(chosen, names)], blank=False)
    set_threads(threads)
    if config.early_exit is not None:  # the exit layer is checked before any weights load
        from ..models.load import target_layers

        asked = choose.decode_pair_config(request)
        config.early_exit.check_target_layers(
            target_layers(asked.target, request.trust_remote_code, asked.target_revision)
        )
    pair = choose.load_decode_pair(request)
    setting = choose.BenchSetting(
        policy_file,
        router_name,
        str(pair.target.model.dtype),
        request.int8,
        torch.get_num_threads(),
        request.draft_attention,
    )
    decoder_for = functools.cache(lambda drafter: make_decoder(pair, drafter))
    return choose.decoder_plan(decoder_for, pair.tokenizer, chosen, policy, config, setting, out)
