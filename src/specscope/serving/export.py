"""Export a tuned policy (``specscope tune``) as the settings of the engines people serve with,
checked against the engine versions they fit.

One engine configuration per domain the router produces (no engine takes a speculation setting
per request), and the routing rule that picks the domain of a request. :data:`ENGINES` is the
registry by engine name. Each engine's export module (``specscope.serving.vllm.export``,
``sglang.export``, ``llamacpp.export``, ``trtllm``, ``hf_transformers``) holds its checked
versions (:class:`~specscope.serving.export_rules.EngineVersion`: the engine files and commits the
rules were read from, the fields and values allowed, the length and budget rules) and validates
its own output against the chosen version before returning it. A setting an engine cannot express
is refused with the reason and what to do instead; an engine that approximates the exported shape
says so in the document's ``approximation``. Each domain's drafter (the policy's: draft model,
ngram, early exit) goes to the engine's own method for it, checked like the rest; an engine's
n-gram drafter that is not the rule specscope measured (vLLM's) is an approximation, and a drafter
the engine lacks is refused (:func:`~specscope.serving.export_plan.check_drafter`).

Nothing here talks to an engine or writes a file (the command writes the document with
:func:`specscope.files.write_json`, and llama.cpp's presets file beside it).
"""

from __future__ import annotations

from ..tune.policy import PolicyFile
from ..tune.router import RuleRouter
from . import hf_transformers, trtllm
from .export_plan import DeploymentPlan, ExportOptions, is_chain, routing_rule
from .export_rules import Engine, EngineVersion, ExportError
from .llamacpp import export as llamacpp
from .sglang import export as sglang
from .vllm import export as vllm

EXPORT_FORMAT = "specscope-export/2"

ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("vllm", vllm.VERSIONS, vllm.export, vllm.EXPORTS, vllm.REFUSES),
        Engine("sglang", sglang.VERSIONS, sglang.export, sglang.EXPORTS, sglang.REFUSES),
        Engine("llama.cpp", llamacpp.VERSIONS, llamacpp.export, llamacpp.EXPORTS, llamacpp.REFUSES),
        Engine("trtllm", trtllm.VERSIONS, trtllm.export, trtllm.EXPORTS, trtllm.REFUSES),
        Engine(
            "transformers",
            hf_transformers.VERSIONS,
            hf_transformers.export,
            hf_transformers.EXPORTS,
            hf_transformers.REFUSES,
        ),
    )
}


def export_policy(
    policy: PolicyFile,
    engine: str,
    options: ExportOptions = ExportOptions(),
    source: str = "",
    engine_version: str | None = None,
    router: RuleRouter = RuleRouter(),
) -> dict:
    """Every routed domain's setting for ``engine`` at ``engine_version`` (default: the newest
    checked), the routing rule, and where the engine's rules were read from."""
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r}; allowed: {', '.join(ENGINES)}")
    spec = ENGINES[engine]
    version = spec.version(engine_version)
    # the target bounds an early exit only where the engine drafts one (elsewhere the engine's
    # refusal of the domain is the error to give)
    target = options.target if "early-exit" in version.drafters else None
    plan = DeploymentPlan.from_policy(policy, source, router, target)
    body = spec.export(plan, options, version)
    approximation = body.pop("approximation", version.approximation)
    return {
        "format": EXPORT_FORMAT,
        "engine": engine,
        "engine_version": version.version,
        "checked_against": list(version.checked_against),
        "approximation": approximation,
        "notes": [*version.notes, *plan.notes],
        "policy": source,
        **body,
        "routing": routing_rule(router),
    }


def engines_table() -> str:
    """The engines table (docs/reference/engines.md): engine | versions checked | what is exported | refused and why."""
    rows = [
        "| engine | versions checked | what is exported | what is refused and why |",
        "|---|---|---|---|",
    ]
    for e in ENGINES.values():
        versions = "; ".join(
            f"{v.version} ({v.about})" if v.about else v.version for v in e.versions
        )
        rows.append(f"| {e.name} | {versions} | {e.exports} | {e.refuses} |")
    return "\n".join(rows)


__all__ = [
    "ENGINES",
    "EXPORT_FORMAT",
    "Engine",
    "EngineVersion",
    "ExportError",
    "ExportOptions",
    "engines_table",
    "export_policy",
    "is_chain",
]
