"""What a report and ``specscope analyze`` say first, and what they leave out of shipped files.

- :func:`pair_title`: the pair by the names a user knows its models by ("Qwen2.5-Coder-0.5B-Instruct
  drafting for Qwen2.5-Coder-1.5B-Instruct"), read from the run's manifest.
- :func:`run_subtitle`: the tree, dtype, prompts per domain and date of the run, in one line.
- :func:`first_screen_grids`: tokens per step by domain with intervals, where speculation pays
  most and least, and the best stop signal (when the scorecard was computed).
- :func:`console_grids`: what ``specscope analyze`` prints, in order: the first screen, then the
  paper's claims, then the tables.
- :func:`portable`: an analysis with no absolute path of the machine that made it (the run
  directory, model caches, local model directories), as the output files write it.

Nothing here computes a figure: every number comes from the analysis.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path, PurePosixPath, PureWindowsPath

from .prepare import ALL
from .render import Column, Grid, findings_grid
from .results import Analysis
from .stats import Estimate

# --- the pair by name ------------------------------------------------------------------------------

# A GGUF file's quantisation suffix ("-Q4_K_M", ".IQ3_XS", "-BF16"): not part of the model's name.
_QUANT = re.compile(r"[-.](?:I?Q\d\w*|F16|BF16|F32)$", re.IGNORECASE)

_DRAFTERS = {  # model-free or self-speculative drafters, by kind (specscope.drafters.DRAFTERS)
    "ngram": "prompt lookup (n-gram)",
    "llama-ngram-simple": "prompt lookup (llama.cpp ngram-simple)",
}


def _demo_name(role: str) -> str:
    """The name of the demo pair's model in ``role`` ("draft" or "target")."""
    try:
        from ..models.config import DEMO_MODELS
    except ImportError:  # pragma: no cover - the models need torch, which specscope requires
        return f"the demo {role}"
    spec = DEMO_MODELS.get(role)
    return spec.name if spec is not None else f"demo:{role}"


def is_absolute(text: str) -> bool:
    """Whether ``text`` is an absolute path on a POSIX or Windows machine."""
    return PurePosixPath(text).is_absolute() or PureWindowsPath(text).is_absolute()


def _path_name(text: str) -> str:
    return (PureWindowsPath(text) if "\\" in text else PurePosixPath(text)).name or text


def model_name(source: str) -> str:
    """A model as a user knows it: the demo pair's models by their names, a hub id as it is, a
    local directory or GGUF file by its name; without a GGUF quantisation suffix."""
    source = str(source).strip()
    if source.startswith("demo:"):
        name = _demo_name(source.removeprefix("demo:"))
    elif is_absolute(source) or source.startswith((".", "~")) or source.endswith(".gguf"):
        name = _path_name(source.rstrip("/\\")).removesuffix(".gguf")
    else:
        name = source  # a hub id: owner/name
    return _QUANT.sub("", name) or source


def _drafter_name(drafter: dict, target: str) -> str:
    kind = str(drafter.get("kind") or "draft-model")
    if kind == "early-exit":
        return f"{target}'s first {drafter.get('exit_layer')} layers"
    return _DRAFTERS.get(kind, kind)


def pair_title(manifest: dict, run_id: str = "") -> str:
    """The pair by name: "<draft> drafting for <target>" (a model-free drafter by what it does);
    a synthetic run says so; a manifest that names no target gives the run id."""
    config = manifest.get("config") or {}
    if config.get("synthetic"):
        return "Synthetic run: simulated acceptance, no models"
    pair = config.get("pair") or {}
    models = manifest.get("models") or {}
    target_source = pair.get("target") or (models.get("target") or {}).get("source")
    if not target_source:
        return f"Run {run_id or manifest.get('run_id', '')}".strip()
    target = model_name(target_source)
    drafter = config.get("drafter") or {}
    if (drafter.get("kind") or "draft-model") != "draft-model":
        draft = _drafter_name(drafter, target)
    else:
        draft_source = pair.get("draft") or (models.get("draft") or {}).get("source") or "?"
        draft = model_name(draft_source)
    return f"{draft} drafting for {target}"


def _tree_words(manifest: dict, max_depth: int) -> str:
    config = manifest.get("config") or {}
    tree = config.get("tree")
    policy = tree.get("policy") if isinstance(tree, dict) else tree
    per_depth = (manifest.get("tree") or {}).get("nodes_per_depth") or []
    if per_depth:
        shape = f"{sum(per_depth)} nodes, depth {len(per_depth)}"
    else:
        shape = f"depth {max_depth}"
    return f"{policy} tree ({shape})" if policy else f"tree of {shape}"


def _dtype_words(manifest: dict) -> str:
    pair = (manifest.get("config") or {}).get("pair") or {}
    if not pair.get("dtype"):
        return ""
    words = str(pair["dtype"])
    if pair.get("quantize"):
        words += f", {pair['quantize']} weights"
    if pair.get("device"):
        words += f", {pair['device']}"
    return words


def _prompt_words(domains: tuple[str, ...], counts: tuple[int, ...]) -> str:
    if not domains:
        return ""
    if counts and len(set(counts)) == 1:
        return f"{counts[0]} prompts per domain ({', '.join(domains)})"
    if counts:
        return "prompts: " + ", ".join(f"{d} {n}" for d, n in zip(domains, counts))
    return f"domains: {', '.join(domains)}"


def _date_words(manifest: dict) -> str:
    created = str(manifest.get("created") or "")[:10]
    finished = str(manifest.get("finished") or "")[:10]
    if created and finished and finished != created:
        return f"measured {created} to {finished}"
    return f"measured {created}" if created else ""


def run_subtitle(a: Analysis) -> str:
    """The run in one line: tree, dtype, prompts per domain, the date it was measured, its id."""
    m = a.info.manifest
    parts = [
        _tree_words(m, a.info.max_depth),
        _dtype_words(m),
        _prompt_words(a.info.domains, a.info.domain_prompts),
        _date_words(m),
        f"run {a.info.run_id}",
    ]
    return " · ".join(p for p in parts if p)


# --- the first screen ------------------------------------------------------------------------------


def _tokens(a: Analysis) -> tuple[str, list[tuple[str, int, Estimate, Estimate]]]:
    """(what the figures are, [(domain, prompts, tokens per step, top-1 chain's)]): decoded (the
    recorded trees replayed) where the analysis holds it, else the position mean."""
    if a.delivered is not None:
        rows = [(r.domain, r.prompts, r.decoded, r.chain) for r in a.delivered.decoded.rows]
        return "decoded (the recorded trees replayed as greedy decoding)", rows
    counts = dict(zip(a.info.domains, a.info.domain_prompts))
    counts[ALL] = a.info.prompts
    rows = [(r.domain, counts.get(r.domain, 0), r.tau, r.chain_tau) for r in a.tau if r.steps]
    return "the position mean of accepted + 1 (no replay in this analysis)", rows


def _relative(a: Analysis) -> dict[str, Estimate]:
    """Each domain's tokens per step relative to the other domains' (prompt level, else step)."""
    levels = getattr(a.delivered, "levels", None)
    if levels is None:
        return {}
    out: dict[str, Estimate] = {}
    for e in levels.effects:
        if e.level == "prompt" or e.domain not in out:
            out[e.domain] = e.relative
    return out


def _compared(rel: Estimate | None) -> str:
    if rel is None or not rel.defined:
        return ""
    if not rel.has_interval:
        return "no interval"
    if rel.lo > 0:
        return "above the others"
    if rel.hi < 0:
        return "below the others"
    return "no clear difference"


def _pct(e: Estimate) -> str:
    return f"{e.value:+.0%}" if e.defined else "—"


def tokens_grid(a: Analysis) -> Grid:
    """Tokens per step by domain, with intervals, the top-1 chain's, and each domain against the
    others."""
    what, rows = _tokens(a)
    rel = _relative(a)
    conf = f"{a.settings.confidence:.0%}"
    return Grid(
        "first_tokens_per_step",
        "Tokens per step by domain (what speculation delivers)",
        (
            Column("Domain"),
            Column("Prompts"),
            Column(f"tokens/step [{conf} CI]", 2),
            Column("top-1 chain", 2),
            Column("vs other domains", 2, signed=True),
            Column("Compared"),
        ),
        tuple(
            (d, n, tok, chain, rel.get(d), _compared(rel.get(d)) if d != ALL else "")
            for d, n, tok, chain in rows
        ),
        f"Tokens the target emits per step, accepted draft + bonus (1 = no gain); {what}. "
        "vs other domains: relative to the others' mean (+0.10: 10% more).",
    )


def _stop_signal_rows(a: Analysis) -> list[tuple[str, str]]:
    d = a.delivered
    card = getattr(d, "scorecard", None)
    if card is None:
        why = "; ".join(getattr(d, "notes", ()) or ()) or "analyze with --predictors to rank them"
        return [("Best stop signal", f"not scored: {why}")]
    s = card.stop_signal
    if s is None:
        return [("Best stop signal", "none: fewer than two draft-side signals could be scored")]
    ahead = "ahead of" if s.distinguished else "not distinguished from"
    rows = [
        (
            "Best stop signal",
            f"{s.signal} (prefix AUROC {s.auroc.format(3)}), {ahead} {s.runner_up} "
            f"(difference {s.difference.format(3, signed=True)})",
        )
    ]
    rules = getattr(d, "stop_rules", None)
    if rules is not None:
        pooled = [r for r in rules.rows if r.domain == ALL]
        base = next((r for r in pooled if r.threshold != r.threshold), None)  # NaN: no rule
        ruled = [r for r in pooled if r is not base and r.tokens_per_step.defined]
        best = max(ruled, key=lambda r: r.tokens_per_step.value, default=None)
        if best is not None and base is not None:
            rows.append(
                (
                    f"Stopping on the {rules.signal}",
                    f"{best.rule}: {best.tokens_per_step.format(2)} tokens per step, against "
                    f"{base.tokens_per_step.format(2)} for the chain drafted whole (All)",
                )
            )
    return rows


def where_it_pays_grid(a: Analysis) -> Grid:
    """In words: the domains where speculation delivers most and least, what the tree adds over
    its top-1 chain, and the best stop signal."""
    _, rows = _tokens(a)
    rel = _relative(a)
    domains = [(d, tok) for d, _, tok, _ in rows if d != ALL and tok.defined]
    lines: list[tuple[str, str]] = []
    if domains:
        ranked = sorted(domains, key=lambda x: -x[1].value)

        def said(d: str, tok: Estimate) -> str:
            r = rel.get(d)
            vs = f", {_pct(r)} vs the others: {_compared(r)}" if r is not None else ""
            return f"{d}: {tok.format(2, interval=False)} tokens per step{vs}"

        lines.append(("Most tokens per step", said(*ranked[0])))
        if len(ranked) > 1:
            lines.append(("Fewest tokens per step", said(*ranked[-1])))
    pooled = next((r for r in rows if r[0] == ALL), None)
    if pooled is not None and pooled[2].defined and pooled[3].defined:
        gain = pooled[2].value - pooled[3].value
        lines.append(
            (
                "The tree over its top-1 chain",
                f"{gain:+.2f} tokens per step ({pooled[2].format(2, interval=False)} against "
                f"{pooled[3].format(2, interval=False)}, all domains)",
            )
        )
    lines += _stop_signal_rows(a)
    return Grid(
        "first_where_it_pays",
        "Where speculation pays",
        (Column("Question"), Column("This run")),
        tuple(lines),
        "Tokens per step only: drafting's own cost is not timed here (specscope bench times it).",
    )


def first_screen_grids(a: Analysis) -> list[Grid]:
    """What ``analyze`` prints first: tokens per step by domain, then where speculation pays and
    the best stop signal."""
    return [tokens_grid(a), where_it_pays_grid(a)]


# The tables ``analyze --show main`` prints after the first screen and the claims, in order: what
# decoding delivers, then the predictors, then the paper's tables and the node-level results.
MAIN_TABLES = (
    "decoded_tokens_per_step",
    "level_shares",
    "domain_effect",
    "scorecard_node",
    "scorecard_prefix",
    "scorecard_stop_rules",
    "tau",
    "table1",
    "table2",
    "table3",
    "table4",
    "table5",
    "table6",
    "acceptance_vector",
    "effects",
    "variance",
    "stratified_rho",
    "stratified_alpha",
    "stratified_depth",
    "paradox",
    "echo",
)


# What ``analyze --show`` may ask for: the main tables, all of them, or none.
SHOWS = ("main", "all", "none")


def console_grids(a: Analysis, grids: list[Grid], show: str = "main") -> list[Grid]:
    """What ``specscope analyze`` prints, in order: the first screen (:func:`first_screen_grids`),
    the paper's claims (compact), then the main tables of ``grids`` (:data:`MAIN_TABLES`); with
    ``show`` "all", the first screen and every grid (the claims in full first); "none": nothing."""
    if show == "none":
        return []
    if show == "all":  # the claims in full lead the run's tables
        return first_screen_grids(a) + list(grids)
    stratified = a.stratification.findings if a.stratification is not None else ()
    claims = findings_grid(a.findings, compact=True, stratified=stratified)
    by_key = {g.key: g for g in grids}
    return first_screen_grids(a) + [claims] + [by_key[k] for k in MAIN_TABLES if k in by_key]


# --- no absolute paths in shipped files ------------------------------------------------------------


def portable_path(path: str | Path) -> str:
    """A path as an output file may write it: a relative path as it is; an absolute one relative
    to the working directory when inside it, else by its name alone."""
    text = str(path)
    if not is_absolute(text):
        return text
    try:
        return Path(text).relative_to(Path.cwd()).as_posix() or "."
    except ValueError:
        return _path_name(text.rstrip("/\\")) or text


def _portable_values(obj, replacements: dict[str, str]):
    """``obj`` (JSON-like) with every absolute path (a whole string) by its name, and the known
    absolute paths inside longer text replaced."""
    if isinstance(obj, dict):
        return {k: _portable_values(v, replacements) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_portable_values(v, replacements) for v in obj)
    if isinstance(obj, str):
        if is_absolute(obj) and "\n" not in obj and len(obj) < 4096:
            return _path_name(obj.rstrip("/\\")) or obj
        return _replace_all(obj, replacements)
    return obj


def _replace_all(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        if old and old in text:
            text = text.replace(old, new)
    return text


def _known_roots(run_path: str) -> dict[str, str]:
    """Absolute paths of this machine that text may hold, longest first, and what replaces them."""
    roots: dict[str, str] = {}
    if is_absolute(run_path):
        roots[run_path.rstrip("/")] = portable_path(run_path)
    try:
        from ..cache import CACHE_VARIABLE, cache_dir

        roots[str(cache_dir())] = CACHE_VARIABLE
    except Exception:  # pragma: no cover - an unreadable environment: no cache to name
        pass
    cwd = os.getcwd()
    roots[cwd + os.sep] = ""
    roots[str(Path.home())] = "~"
    return dict(sorted(roots.items(), key=lambda kv: -len(kv[0])))


def portable(a: Analysis) -> Analysis:
    """``a`` as output files write it: the run directory relative or by name, and no absolute path
    of this machine in its manifest (model caches, local model directories: by name) or warnings."""
    roots = _known_roots(a.info.path)
    info = replace(
        a.info,
        path=portable_path(a.info.path),
        manifest=_portable_values(a.info.manifest, roots),
    )
    return replace(a, info=info, warnings=tuple(_replace_all(w, roots) for w in a.warnings))


__all__ = [
    "MAIN_TABLES",
    "SHOWS",
    "console_grids",
    "first_screen_grids",
    "model_name",
    "pair_title",
    "portable",
    "portable_path",
    "run_subtitle",
    "tokens_grid",
    "where_it_pays_grid",
]
