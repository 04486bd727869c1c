"""Export a tuned policy (``specscope tune``) as settings of the engines people serve with.

One setting per domain, one for any other domain (the policy's uniform tree) and the routing rule
that picks the domain of a request, written in each engine's own field names:

- ``vllm``: the ``--speculative-config`` JSON (``method``, ``model``, ``num_speculative_tokens``,
  and for tree methods ``speculative_token_tree``, a path-tuple string with one tuple per drafted
  token). vLLM takes one config per server, so each domain is a server and the rule routes to it.
- ``sglang``: server flags (``--speculative-num-steps``, ``--speculative-eagle-topk``,
  ``--speculative-num-draft-tokens``), one server per domain as for vLLM.
- ``llama.cpp``: the per-request fields of llama-server (``speculative.n_max``, ``n_min``,
  ``p_min``): one server, the client sets them on each request by its domain.
- ``trtllm``: TensorRT-LLM ``EagleDecodingConfig`` fields, ``eagle_choices`` as path lists.
- ``transformers``: ``generate`` keyword arguments of assisted generation.

Engines that draft a chain (llama.cpp, transformers, vLLM's ``draft_model`` method) refuse a tree
with branches rather than approximate it. Nothing here talks to an engine or writes a file (the
command writes the document with :func:`specscope.files.write_json`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from .errors import SpecscopeError
from .tune.policy import PolicyFile
from .tune.router import RuleRouter
from .trees import TreeShape

EXPORT_FORMAT = "specscope-export/1"
VLLM_METHODS = ("draft_model", "eagle", "eagle3")
VLLM_TREE_METHODS = ("eagle", "eagle3")


class ExportError(SpecscopeError, ValueError):
    """A policy that the chosen engine cannot express, or a missing export option."""


@dataclass(frozen=True)
class ExportOptions:
    draft: str | None = None  # the draft model as the engine loads it (path or hub id)
    method: str = "draft_model"  # vLLM's speculative method


def is_chain(shape: TreeShape) -> bool:
    """One node per depth, each the draft's top-1: what a chain-only engine can draft."""
    return all(rank == 0 for rank in shape.ranks) and len(shape) == shape.max_depth


def _chain_length(shape: TreeShape, engine: str, where: str) -> int:
    if not is_chain(shape):
        raise ExportError(
            f"{where}: tree {shape.to_paths_literal()} has branches, but {engine} drafts a chain "
            "of top-1 tokens; tune chains only (specscope tune --max-rank 1) or export to an "
            "engine that takes trees (vllm --method eagle, sglang, trtllm)")
    return shape.max_depth


def _draft(options: ExportOptions, engine: str) -> str:
    if not options.draft:
        raise ExportError(f"{engine} needs the draft model it should load: pass --draft "
                          "(a local path or a hub id)")
    return options.draft


def _vllm(shape: TreeShape | None, options: ExportOptions, where: str) -> dict:
    if shape is None:
        return {"speculative_config": None, "serve_args": []}
    if options.method not in VLLM_METHODS:
        raise ExportError(f"unknown vLLM method {options.method!r}; allowed: "
                          f"{', '.join(VLLM_METHODS)}")
    config = {"method": options.method, "model": _draft(options, "vllm")}
    if options.method in VLLM_TREE_METHODS and not is_chain(shape):
        config["num_speculative_tokens"] = len(shape)
        config["speculative_token_tree"] = str([tuple(p) for p in shape.paths])
    else:
        config["num_speculative_tokens"] = _chain_length(
            shape, f"vLLM method {options.method!r}", where)
    return {"speculative_config": config,
            "serve_args": ["--speculative-config", json.dumps(config)]}


def _sglang(shape: TreeShape | None, options: ExportOptions, where: str) -> dict:
    if shape is None:
        return {"flags": {}, "serve_args": []}
    topk = max(shape.ranks) + 1  # children per node
    flags = {"--speculative-algorithm": "STANDALONE",
             "--speculative-draft-model-path": _draft(options, "sglang"),
             "--speculative-num-steps": shape.max_depth,
             "--speculative-eagle-topk": topk,
             # tokens verified per step: the drafted nodes and the last accepted token
             "--speculative-num-draft-tokens": len(shape) + 1}
    return {"flags": flags, "serve_args": [str(x) for kv in flags.items() for x in kv]}


def _llamacpp(shape: TreeShape | None, options: ExportOptions, where: str) -> dict:
    n_max = 0 if shape is None else _chain_length(shape, "llama.cpp", where)
    # p_min 0: draft all n_max tokens, as the tuned chain assumes (llama.cpp stops drafting
    # early when the draft's probability falls below p_min)
    return {"request": {"speculative.n_max": n_max, "speculative.n_min": 0,
                        "speculative.p_min": 0.0}}


def _trtllm(shape: TreeShape | None, options: ExportOptions, where: str) -> dict:
    if shape is None:
        return {"speculative_config": None}
    return {"speculative_config": {"decoding_type": "Eagle", "max_draft_len": shape.max_depth,
                                   "eagle_choices": [list(p) for p in shape.paths],
                                   "speculative_model_dir": _draft(options, "trtllm")}}


def _transformers(shape: TreeShape | None, options: ExportOptions, where: str) -> dict:
    if shape is None:
        return {"assistant_model": None, "generate_kwargs": {}}
    return {"assistant_model": _draft(options, "transformers"),
            "generate_kwargs": {"num_assistant_tokens": _chain_length(shape, "transformers", where),
                                "num_assistant_tokens_schedule": "constant",
                                "assistant_confidence_threshold": 0.0}}


EXPORTERS: dict[str, Callable[[TreeShape | None, ExportOptions, str], dict]] = {
    "vllm": _vllm, "sglang": _sglang, "llama.cpp": _llamacpp, "trtllm": _trtllm,
    "transformers": _transformers,
}


def routing_rule(router: RuleRouter = RuleRouter()) -> dict:
    """The rule that gives a request its domain: the weighted patterns of specscope's router."""
    return {"router": router.name, "threshold": router.threshold, "fallback": router.fallback,
            "flags": "IGNORECASE | MULTILINE",
            "rules": [{"domain": r.domain, "pattern": r.pattern, "weight": r.weight}
                      for r in router.rules],
            "decide": "sum the weights of matching rules per domain; the largest sum wins if "
                      "it reaches the threshold, else the fallback domain"}


def export_policy(policy: PolicyFile, engine: str, options: ExportOptions = ExportOptions(),
                  source: str = "") -> dict:
    """Every domain's setting for ``engine``, the fallback setting and the routing rule."""
    if engine not in EXPORTERS:
        raise ExportError(f"unknown engine {engine!r}; allowed: {', '.join(EXPORTERS)}")
    exporter = EXPORTERS[engine]
    domains = {}
    for domain, shape in policy.trees.items():
        domains[domain] = {"tree": shape.to_paths_literal() if shape else "none",
                           **exporter(shape, options, f"domain {domain!r}")}
    fallback = {"tree": policy.uniform.to_paths_literal() if policy.uniform else "none",
                **exporter(policy.uniform, options, "the uniform tree (other domains)")}
    return {"format": EXPORT_FORMAT, "engine": engine, "policy": source, "domains": domains,
            "fallback": fallback, "routing": routing_rule()}
