"""The ``specscope`` command line: a thin layer over the library."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    name="specscope",
    help="Acceptance dynamics of tree-based speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Acceptance dynamics of tree-based speculative decoding: measure, analyse, certify, speculate."""


def fail(message: str) -> None:
    """Print a one-line error and exit with status 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


# --- run (measurement engine) ------------------------------------------------------------------


@app.command()
def run(
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="Run directory to write (or resume)."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Preset (paper, demo) or TOML file; options below override it."),
    draft: Optional[str] = typer.Option(None, help="Draft model: hub id, local dir, .gguf file, or demo:draft."),
    target: Optional[str] = typer.Option(None, help="Target model: hub id, local dir, .gguf file, or demo:target."),
    dtype: Optional[str] = typer.Option(None, help="bfloat16, float16 or float32."),
    device: Optional[str] = typer.Option(None, help="Target device, e.g. cpu or cuda:0."),
    draft_device: Optional[str] = typer.Option(None, help="Draft device (defaults to --device)."),
    trust_remote_code: Optional[bool] = typer.Option(None, "--trust-remote-code", help="Allow model code from the hub."),
    policy: Optional[str] = typer.Option(None, help="Tree policy: paper, paper-text, chain, static."),
    top_k: Optional[int] = typer.Option(None, help="Root candidates (paper: min(top_k, branch) roots)."),
    branch: Optional[int] = typer.Option(None, help="Children per node."),
    depth: Optional[int] = typer.Option(None, help="Tree depth (chain length for 'chain')."),
    max_nodes: Optional[int] = typer.Option(None, help="Node cap, breadth-first."),
    paths: Optional[str] = typer.Option(None, help='Static tree as path tuples, e.g. "[(0,), (1,), (0, 0)]".'),
    engine: Optional[str] = typer.Option(None, help="cached (KV caches, one tree pass) or naive (paper's full recompute)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSONL file of {id, domain, prompt|messages}."),
    domains: Optional[str] = typer.Option(None, help="Comma-separated domains, e.g. code,math,reasoning,chat."),
    per_domain: Optional[int] = typer.Option(None, help="Prompts sampled per domain."),
    smoke: bool = typer.Option(False, "--smoke", help="Use the built-in 4-prompt smoke set."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Tokens to generate per prompt."),
    max_prompt_tokens: Optional[int] = typer.Option(None, help="Keep the last N prompt tokens."),
    chat_template: Optional[bool] = typer.Option(None, "--chat-template/--no-chat-template", help="Apply the model's chat template."),
    seed: Optional[int] = typer.Option(None, help="Seed for prompt sampling."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete a run with another config in --out and start over."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Measure draft-tree acceptance node by node (the paper protocol) into a run directory."""
    from .domains import PromptSourceError
    from .models import ModelLoadError
    from .records import RunDirError
    from .runner import RunConfigError, load_config, run_study
    from .trees import TreeConfigError

    prompt_file = str(prompts) if prompts else None
    domain_list = tuple(d.strip() for d in domains.split(",") if d.strip()) if domains else None
    try:
        base = load_config(config)
        if smoke or prompt_file:  # an explicit prompt choice replaces the preset's
            base = base.replace(**{"prompts.domains": (), "prompts.per_domain": None})
        cfg = base.replace(**{
            "pair.draft": draft, "pair.target": target, "pair.dtype": dtype,
            "pair.device": device, "pair.draft_device": draft_device,
            "pair.trust_remote_code": trust_remote_code,
            "tree.policy": policy, "tree.top_k": top_k, "tree.branch": branch,
            "tree.depth": depth, "tree.max_nodes": max_nodes, "tree.paths": paths,
            "engine": engine, "prompts.file": prompt_file, "prompts.domains": domain_list,
            "prompts.per_domain": per_domain, "prompts.smoke": smoke or None,
            "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
            "chat_template": chat_template, "seed": seed,
        })
        summary = run_study(cfg, out, overwrite=overwrite, progress=not quiet)
    except (RunConfigError, TreeConfigError, PromptSourceError, ModelLoadError, RunDirError) as e:
        fail(str(e))
    if summary.already_complete:
        typer.echo(f"{out}: run {summary.run_id} is already complete ({summary.prompts_total} prompts); nothing to do")
        return
    rate = summary.nodes / summary.seconds if summary.seconds else 0.0
    typer.echo(f"{out}: measured {summary.prompts_measured} prompt(s), {summary.nodes} nodes "
               f"in {summary.seconds:.1f} s ({rate:.1f} nodes/s); "
               f"{summary.prompts_skipped_empty} empty prompt(s) skipped")

# --- domains ----------------------------------------------------------------------------------

# --- analyze / report / compare ----------------------------------------------------------------

# --- certify ----------------------------------------------------------------------------------


if __name__ == "__main__":
    app()
