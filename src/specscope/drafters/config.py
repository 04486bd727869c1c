"""The drafter registry and DrafterConfig: which drafter proposes the tree, with which parameters.

A drafter is one of :data:`DRAFTERS`:

- ``draft-model``: the pair's draft model (the default): a tree of its top tokens, with its
  distribution q recorded at every context.
- ``ngram``: model-free prompt lookup, vLLM's ngram proposer (:mod:`specscope.drafters.ngram`):
  one chain of the tokens that followed the earliest occurrence of the context's longest
  repeated suffix (n tokens, prompt_lookup_min <= n <= prompt_lookup_max). It has
  no distribution: its proposal probability is 1 (a point mass), so a node's alpha is its
  p_target.
- ``llama-ngram-simple``: model-free lookup, llama.cpp's ``ngram-simple``
  (:mod:`specscope.drafters.llama_ngram`): the tokens that followed the latest earlier occurrence
  of the context's last ``ngram_size`` tokens; the chain's depth K is llama.cpp's M. A point mass,
  as ``ngram``.
- ``early-exit``: self-speculation: the target's first ``exit_layer`` layers, its final norm and
  its LM head (:mod:`specscope.drafters.early_exit`), a draft that shares the target's weights
  and vocabulary.

:class:`DrafterConfig` validates a choice before any model loads; it loads nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import SpecscopeError
from ..limits import MAX_LAYERS, MAX_NGRAM
from ..schemas import INPUT


class DrafterError(SpecscopeError, ValueError):
    """A drafter or drafter parameter that cannot be used; the message says what is allowed."""


@dataclass(frozen=True)
class DrafterKind:
    """One entry of the registry: its parameters and what it proposes."""

    summary: str
    params: tuple[str, ...]  # the DrafterConfig fields it takes
    has_distribution: bool  # False: proposals are point masses (p_draft = 1)
    chain_only: bool  # True: proposes one chain, whose length is the tree's depth


DRAFTERS: dict[str, DrafterKind] = {
    "draft-model": DrafterKind("the pair's draft model", (), True, False),
    "ngram": DrafterKind(
        "prompt lookup (vLLM's ngram proposer): the tokens after the earliest occurrence of "
        "the longest suffix of the context, n from prompt_lookup_max down to prompt_lookup_min",
        ("prompt_lookup_min", "prompt_lookup_max"),
        False,
        True,
    ),
    "llama-ngram-simple": DrafterKind(
        "prompt lookup (llama.cpp's ngram-simple): the tokens after the latest earlier "
        "occurrence of the context's last ngram_size tokens, none if fewer than ngram_size follow",
        ("ngram_size",),
        False,
        True,
    ),
    "early-exit": DrafterKind(
        "self-speculation: the target's first exit_layer layers, its final norm and LM head",
        ("exit_layer",),
        True,
        False,
    ),
}
# vLLM 0.33.0 (4ba787ec9), vllm/config/speculative.py, SpeculativeConfig.__post_init__: with
# method "ngram" and neither bound given, both are 5; one given, the other takes its value (the
# field docstring's "Defaults to 1" for prompt_lookup_min is not what the code does)
NGRAM_DEFAULT_N = 5
# llama.cpp b11312, common/common.h: --spec-ngram-simple-size-n defaults to 12 (size-m to 48)
LLAMA_NGRAM_DEFAULT_N = 12
# The largest value of each parameter (specscope.limits); an early exit is checked against its
# target's layers once the target is known (DrafterConfig.check_target_layers).
PARAM_MAX = {
    "prompt_lookup_min": MAX_NGRAM,
    "prompt_lookup_max": MAX_NGRAM,
    "ngram_size": MAX_NGRAM,
    "exit_layer": MAX_LAYERS,
}


@dataclass(frozen=True)
class DrafterConfig:
    """Which drafter proposes the tree, and its parameters (None: not given)."""

    __pydantic_config__ = INPUT  # a config file's [drafter] table (specscope.schemas)

    kind: str = "draft-model"
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    ngram_size: int | None = None
    exit_layer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in DRAFTERS:
            raise DrafterError(
                f"unknown drafter {self.kind!r}; choose one of {', '.join(DRAFTERS)}"
            )
        allowed = DRAFTERS[self.kind].params
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "kind" or value is None:
                continue
            if f.name not in allowed:
                owner = next(k for k, v in DRAFTERS.items() if f.name in v.params)
                raise DrafterError(
                    f"{f.name} is a parameter of the {owner} drafter, not of {self.kind}"
                    + (f" (it takes {', '.join(allowed)})" if allowed else " (it takes none)")
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DrafterError(f"{f.name} must be an integer >= 1, got {value!r}")
            high = PARAM_MAX[f.name]
            if value > high:
                raise DrafterError(f"{f.name} must be an integer in 1..{high}, got {value!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise DrafterError(f"prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
        if self.kind == "early-exit" and self.exit_layer is None:
            raise DrafterError(
                "the early-exit drafter needs exit_layer (1 <= exit_layer < the target's layers)"
            )

    @property
    def spec(self) -> DrafterKind:
        return DRAFTERS[self.kind]

    @property
    def has_distribution(self) -> bool:
        return self.spec.has_distribution

    def resolved(self) -> DrafterConfig:
        """The config with the drafter's defaults filled in, as the engine would run it."""
        if self.kind == "llama-ngram-simple":
            n = self.ngram_size if self.ngram_size is not None else LLAMA_NGRAM_DEFAULT_N
            return DrafterConfig(self.kind, ngram_size=n)
        if self.kind != "ngram":
            return self
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        lo = lo if lo is not None else hi if hi is not None else NGRAM_DEFAULT_N
        hi = hi if hi is not None else lo
        return DrafterConfig("ngram", prompt_lookup_min=lo, prompt_lookup_max=hi)

    @property
    def params(self) -> dict[str, int]:
        """The resolved parameters, by name."""
        r = self.resolved()
        return {name: getattr(r, name) for name in self.spec.params}

    @property
    def table(self) -> dict:
        """``{"kind": ..., **params}``: the drafter as policy files and cost models write it."""
        return {"kind": self.kind, **self.params}

    @property
    def label(self) -> str:
        """``draft-model``, ``ngram(prompt_lookup_min=2, prompt_lookup_max=4)``,
        ``early-exit(exit_layer=8)``: the name records and tables carry."""
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kind}({params})" if params else self.kind

    def check_chain(self, is_chain: bool, depth: int | None = None) -> None:
        """Refuse a tree this drafter cannot propose: a chain-only drafter (n-gram) proposes one
        chain of top-1 tokens, so its tree must be one (``is_chain``), whatever policy built it;
        llama.cpp's ngram-simple drafts nothing with a chain (its M) shorter than ``ngram_size``.
        The one check of ``run``, ``decode`` and policy files."""
        if self.spec.chain_only and not is_chain:
            raise DrafterError(
                f"the {self.kind} drafter proposes one chain: use --policy chain --depth K "
                "(K tokens per step), not a tree with branches"
            )
        n = self.params.get("ngram_size")
        if n is not None and depth is not None and depth < n:
            raise DrafterError(
                f"the {self.label} drafter never drafts with a chain of {depth} (llama.cpp drafts "
                f"only when at least ngram_size = {n} tokens follow the match, and at most M = the "
                f"chain's depth): use --depth {n} or more, or a smaller --ngram-size"
            )

    def check_target_layers(self, num_layers: int) -> None:
        """An early exit must leave at least one of the target's ``num_layers`` layers out."""
        if self.kind == "early-exit" and not 1 <= self.exit_layer < num_layers:
            raise DrafterError(
                f"exit_layer must be in 1..{num_layers - 1} (the target has {num_layers} "
                f"layers), got {self.exit_layer}"
            )
