"""The deployment an export describes: one engine setting per domain the router produces, and the
routing rule that picks it.

No engine takes a speculation setting per request (llama-server compiles its request fields out,
vLLM and SGLang have none), so a per-domain policy is deployed as one engine configuration per
domain and requests routed to it. :class:`DeploymentPlan` lists those domains: each domain the
router can produce gets the policy's tree for it, or the policy's uniform tree when the policy does
not list it. A policy domain the router cannot produce is refused.

This module knows no engine; the engine modules turn a plan into their own settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...trees import TreeShape
from ...tune.policy import PolicyFile
from ...tune.router import ROUTED_DOMAINS, RuleRouter
from .rules import ExportError


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

    @property
    def tree(self) -> str:
        return self.shape.to_paths_literal() if self.shape else "none"


@dataclass(frozen=True)
class DeploymentPlan:
    domains: tuple[DomainPlan, ...]
    uniform: TreeShape | None
    router: RuleRouter
    policy_source: str = ""
    cost_model: dict | None = None  # the policy's cost model, if it was tuned (vLLM schedule)
    acceptance: dict | None = None  # the policy's acceptance vectors, if tuned
    llama_server: dict | None = None  # the settings `specscope llamacpp` measured, per domain

    @classmethod
    def from_policy(
        cls, policy: PolicyFile, source: str = "", router: RuleRouter = RuleRouter()
    ) -> DeploymentPlan:
        produced = tuple(dict.fromkeys((*ROUTED_DOMAINS, router.fallback)))
        unknown = [d for d in policy.trees if d not in produced]
        if unknown:
            raise ExportError(
                f"policy domain {unknown[0]!r} is not one the router produces; "
                f"allowed: {', '.join(produced)} (other domains use 'uniform')"
            )
        domains = tuple(
            DomainPlan(d, policy.trees[d], "policy")
            if d in policy.trees
            else DomainPlan(d, policy.uniform, "uniform")
            for d in produced
        )
        return cls(
            domains,
            policy.uniform,
            router,
            source,
            policy.info.get("cost_model"),
            policy.info.get("acceptance"),
            policy.info.get("llama_server"),
        )


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
        "rules": [
            {"domain": r.domain, "pattern": r.pattern, "weight": r.weight} for r in router.rules
        ],
        "decide": "sum the weights of matching rules per domain; the largest sum wins if "
        "it reaches the threshold, else the fallback domain",
    }


def presets_path(out: Path) -> Path:
    """Where ``export -o OUT`` writes a llama.cpp presets file: beside OUT, ``OUT`` with .ini."""
    return out.with_suffix(".ini")
