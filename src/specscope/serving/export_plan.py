"""The deployment an export describes: one engine setting per domain the router produces, and the
routing rule that picks it.

No engine takes a speculation setting per request (llama-server compiles its request fields out,
vLLM and SGLang have none), so a per-domain policy is deployed as one engine configuration per
domain and requests routed to it. :class:`DeploymentPlan` lists those domains: each domain the
router can produce gets the policy's tree for it, with its drafter, or the policy's uniform tree
and drafter when the policy does not list it. A policy domain the router cannot produce is refused,
and so is an early exit at or past the layers of the target: the one the policy was tuned for
(``tune`` records its layer count) and the one the export is given (``--target``, its config read,
no weights; a target whose count cannot be read is refused); where neither is known, the plan's
``notes`` say so. Each domain carries what ``tune`` priced its tree on (:func:`pricing`).

This module knows no engine; the engine modules turn a plan into their own settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..drafters.config import DrafterConfig, DrafterError
from ..records import ALL_DOMAINS
from ..trees import TreeShape
from ..tune.policy import PolicyFile
from ..tune.predict import EXTRAPOLATED, REPLAY, TIMED
from ..tune.router import ROUTED_CHARS, ROUTED_DOMAINS, RuleRouter
from .export_rules import EngineVersion, ExportError

# What specscope measured for an ngram domain: vLLM's proposer (specscope.drafters.ngram). An
# engine whose own n-gram drafter differs says so with this, so nobody reads the measured
# acceptance as that engine's.
MEASURED_NGRAM = (
    "specscope measured vLLM's ngram rule (the tokens after the earliest occurrence of the "
    "longest suffix of prompt_lookup_min..prompt_lookup_max tokens, in this request's own "
    "tokens); the acceptance it predicts is that rule's, not this engine's"
)


@dataclass(frozen=True)
class ExportOptions:
    draft: str | None = None  # the draft model as the engine loads it (path or hub id)
    target: str | None = None  # the target model (llama.cpp presets: the GGUF file)
    presets_file: str = "presets.ini"  # llama.cpp: the presets file name in the router command
    poll: int | None = 0  # llama.cpp: --poll for drafting domains (None: llama.cpp's default)


@dataclass(frozen=True)
class DomainPlan:
    domain: str
    shape: TreeShape | None
    source: str  # "policy" (the policy lists the domain) or "uniform"
    drafter: DrafterConfig = DrafterConfig()
    priced_on: str | None = None  # what tune priced the tree on (:func:`pricing`; None: nothing)

    @property
    def tree(self) -> str:
        return self.shape.to_paths_literal() if self.shape else "none"

    @property
    def summary(self) -> dict:
        """What every engine's document says of the domain: its tree, where the tree comes from,
        and the drafter that proposes it (None: no speculation)."""
        drafter = self.drafter.label if self.shape is not None else None
        return {"tree": self.tree, "source": self.source, "drafter": drafter}


@dataclass(frozen=True)
class DeploymentPlan:
    domains: tuple[DomainPlan, ...]
    uniform: TreeShape | None
    router: RuleRouter
    policy_source: str = ""
    llama_server: dict | None = None  # the settings llama-server was timed with, per domain
    notes: tuple[str, ...] = ()  # what the document must say of this policy (unchecked layers)

    @classmethod
    def from_policy(
        cls,
        policy: PolicyFile,
        source: str = "",
        router: RuleRouter = RuleRouter(),
        target: str | None = None,
    ) -> DeploymentPlan:
        """The plan of ``policy``; ``target``: the target model the export is given (its layer
        count bounds an early exit, as the policy's recorded one does)."""
        produced = tuple(dict.fromkeys((*ROUTED_DOMAINS, router.fallback)))
        unknown = [d for d in policy.trees if d not in produced]
        if unknown:
            raise ExportError(
                f"policy domain {unknown[0]!r} is not one the router produces; "
                f"allowed: {', '.join(produced)} (other domains use 'uniform')"
            )
        domains = tuple(
            DomainPlan(d, policy.trees[d], "policy", policy.drafter_for(d), pricing(policy, d))
            if d in policy.trees
            else DomainPlan(
                d, policy.uniform, "uniform", policy.uniform_drafter, pricing(policy, ALL_DOMAINS)
            )
            for d in produced
        )
        stops = {**policy.stops, "uniform": policy.uniform_stop}
        cut = "; ".join(f"{d}: {s.label}" for d, s in stops.items() if s is not None)
        note = f"stop rules ({cut}) cut trees in specscope's decoder only: exported, drafted whole"
        return cls(
            domains,
            policy.uniform,
            router,
            source,
            policy.info.get("llama_server"),
            check_exit_layers(domains, policy.info.get("source"), target)
            + ((note,) if cut else ()),
        )


# how a policy entry's tokens per step were predicted (tune.predict's methods)
PREDICTED = {
    REPLAY: "replayed tokens per step",
    EXTRAPOLATED: "tokens per step extrapolated from the acceptance vector",
    TIMED: "tokens per step timed",
}
DECODERS = {"specscope": "specscope's decoder", "transformers": "transformers' assisted generation"}


def pricing(policy: PolicyFile, name: str) -> str | None:
    """What ``tune`` priced the tree of ``name`` (a domain, or ALL_DOMAINS for the uniform entry)
    on: the tokens per step it predicted from the policy's tuning runs, and the cost model that
    timed the steps. None where the policy records no prediction (not written by tune)."""
    choice = policy.choices.get(name)
    prediction = choice.prediction if choice is not None else policy.predictions.get(name)
    if prediction is None:
        return None
    drafter, backend = policy.drafter_for(name), policy.backend_for(name)
    costs = (policy.info.get("cost_models") or {}).get(drafter.label) or policy.info.get(
        "cost_model"
    )
    hardware = costs.get("hardware") if isinstance(costs, dict) else None
    interval = (
        f" [{prediction.lo:.2f}, {prediction.hi:.2f}]"
        if math.isfinite(prediction.lo) and math.isfinite(prediction.hi)
        else ""
    )
    timed = f"{DECODERS.get(backend, backend)} on one sequence" + (
        f", timed on {hardware}" if hardware else ""
    )
    return (
        f"{PREDICTED[prediction.method]} {prediction.tokens_per_step:.2f}{interval} of the "
        f"policy's tuning runs over its cost model ({timed})"
    )


def check_exit_layers(
    domains: tuple[DomainPlan, ...], source, given: str | None = None
) -> tuple[str, ...]:
    """Refuse an early exit at or past the layers of a known target: the one the policy was tuned
    for (its ``source.target.layers``, written by ``tune``) and ``given``, the target the export
    is given (its layer count read from its config or GGUF header, no weights; refused where it
    cannot be read). Where neither is known, a note saying that the exit layers are unchecked,
    and why."""
    exits = [d for d in domains if d.shape is not None and d.drafter.kind == "early-exit"]
    if not exits:
        return ()
    target = source.get("target") if isinstance(source, dict) else None
    layers = target.get("layers") if isinstance(target, dict) else None
    known: list[tuple[int, str]] = []  # (layer count, where it comes from)
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 2:
            raise ExportError(
                f"the policy's source.target.layers must be an integer >= 2, got {layers!r}"
            )
        known.append((layers, f"{target.get('model') or 'the target'}, as the policy records"))
    if given is not None:
        from ..models.config import ModelLoadError
        from ..models.load import target_layers

        try:
            known.append((target_layers(given), f"{given}, the export's target"))
        except (ModelLoadError, OSError, ValueError, KeyError, ImportError) as e:
            # absent here, or a malformed file: the check asked for cannot be made
            raise ExportError(
                f"early-exit layer(s) {_exit_list(exits)} cannot be checked against the target "
                f"{given!r}: its layer count cannot be read here ({e}); give a target whose "
                "config or GGUF header is readable here, or no target (the layers are then "
                "checked against the policy's recorded target only)"
            ) from None
    for count, where in known:
        for d in exits:
            try:
                d.drafter.check_target_layers(count)
            except DrafterError as e:
                raise ExportError(f"domain {d.domain!r}: {e} ({where})") from None
    if known:
        return ()
    return (
        "the policy does not record its target's layer count (tune it again to record it, or "
        f"give the target): early-exit layer(s) {_exit_list(exits)} are not checked against "
        "the target; each must be below its layer count",
    )


def _exit_list(exits: list[DomainPlan]) -> str:
    return ", ".join(f"{d.drafter.exit_layer} ({d.domain})" for d in exits)


def is_chain(shape: TreeShape) -> bool:
    """One node per depth, each the draft's top-1: what a chain-only engine can draft."""
    return shape.is_chain


def chain_length(shape: TreeShape, engine: str, where: str, instead: str) -> int:
    """The chain's length, or an error naming the tree, the engine and what to do instead."""
    if not is_chain(shape):
        raise ExportError(
            f"{where}: tree {shape.to_paths_literal()} has branches, but {engine} drafts a chain "
            f"of top-1 tokens; {instead}"
        )
    return shape.max_depth


# drafters that re-write one engine's own rule -> that engine
DRAFTER_ENGINE = {"llama-ngram-simple": "llama.cpp"}


def check_drafter(
    domain: DomainPlan,
    version: EngineVersion,
    versions: tuple[EngineVersion, ...],
    missing: dict[str, str],
) -> None:
    """Refuse a domain whose drafter ``version`` does not export: ``missing[kind]`` says why
    (the engine has no such drafter) and what to do; otherwise the versions that export it."""
    kind = domain.drafter.kind
    if domain.shape is None or kind in version.drafters:
        return
    checked = [v.version for v in versions if kind in v.drafters]
    if kind in missing:
        reason = missing[kind]
    elif checked:
        reason = (
            f"its {kind} settings were checked at {', '.join(checked)} only "
            f"(--engine-version {checked[0]})"
        )
    elif kind in DRAFTER_ENGINE:
        reason = (
            f"it is {DRAFTER_ENGINE[kind]}'s own rule: export this policy with --to "
            f"{DRAFTER_ENGINE[kind]}, or tune the domain with ngram or the draft model"
        )
    else:
        reason = f"specscope exports no {kind} drafter to {version.engine}"
    raise ExportError(
        f"domain {domain.domain!r}: {version.engine} {version.version} cannot draft with "
        f"{domain.drafter.label}: {reason}"
    )


def need(value: str | None, option: str, engine: str, what: str) -> str:
    if not value:
        raise ExportError(f"{engine} needs {what}: pass {option}")
    return value


def routing_rule(router: RuleRouter) -> dict:
    """The rule that gives a request its domain: the weighted patterns of specscope's router."""
    return {
        "router": router.name,
        "threshold": router.threshold,
        "fallback": router.fallback,
        "flags": "IGNORECASE | MULTILINE",
        "syntax": "RE2 (linear-time; \\w, \\d, \\s and \\b are ASCII)",
        "reads": f"the first {ROUTED_CHARS} characters of the user turns' text",
        "rules": [
            {"domain": r.domain, "pattern": r.pattern, "weight": r.weight} for r in router.rules
        ],
        "decide": "sum the weights of matching rules per domain; the largest sum wins if "
        "it reaches the threshold, else the fallback domain",
    }


def presets_path(out: Path) -> Path:
    """Where ``export -o OUT`` writes a llama.cpp presets file: beside OUT, ``OUT`` with .ini."""
    return out.with_suffix(".ini")
