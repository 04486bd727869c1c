"""TensorRT-LLM: a ``speculative_config`` per domain for the standalone draft model
(``decoding_type: Draft_Target``), a chain of ``max_draft_len`` tokens, without ``eagle_choices``;
for an ngram domain its NGram drafter (``decoding_type: NGram``).

The Draft_Target mode drafts a linear chain only (``max_total_draft_tokens = max_draft_len``,
tensorrt_llm/llmapi/llm_args.py ``DraftTargetDecodingConfig``); the config is a ``StrictBaseModel``
that refuses unknown fields. Trees are refused: ``eagle_choices`` was deprecated and then removed
(PR #18210), and the dynamic trees of the current config (``use_dynamic_tree``,
``dynamic_tree_max_topK``) belong to EAGLE-3/MTP heads, not to the standalone draft specscope
measures, and grow by the draft's scores rather than in a fixed shape.

``NGramDecodingConfig`` also drafts a linear chain, but by its own rule, not the one specscope
measured (vLLM's): the export says so. TensorRT-LLM has no early-exit drafter: such a domain is
refused. It starts no engine.
"""

from __future__ import annotations

from .export_plan import (
    MEASURED_NGRAM,
    DeploymentPlan,
    ExportOptions,
    chain_length,
    check_drafter,
    need,
)
from .export_rules import EngineVersion, Field, Rule

TRTLLM = "NVIDIA/TensorRT-LLM"

# tensorrt_llm/_torch/speculative/ngram.py NGramPoolManager.get_draft_tokens, read at 02499765
# (the pool's rule; the config fields were read at 00043967): patterns of size
# max_matching_ngram_size down to 1 map to continuations of up to max_draft_len tokens; a new
# continuation evicts the shorter ones of its pattern; the draft is the first stored (is_use_oldest)
# continuation of the longest pattern that ends the context
NGRAM_APPROXIMATION = (
    "TensorRT-LLM's NGram is its own drafter, not vLLM's ngram rule: it keeps a pool of "
    "pattern -> continuations (a longer continuation evicts the shorter ones stored before it), "
    "built from "
    "the request's own tokens (is_public_pool false; its default, true, shares one pool across "
    "requests), and drafts the oldest continuation of the longest pattern of "
    "max_matching_ngram_size tokens or fewer that ends the context (no minimum length: "
    "prompt_lookup_min has no counterpart); " + MEASURED_NGRAM
)
MISSING = {
    "early-exit": "TensorRT-LLM has no early-exit drafter: its speculative_config types draft "
    "with a separate model (Draft_Target), trained heads (Eagle/Eagle3, MTP) or lookups "
    "(NGram, SA), none with the target's own first layers; export this domain to "
    "transformers (assistant_early_exit), or tune it with the draft model or ngram",
}

MAIN_00043967 = EngineVersion(
    engine="trtllm",
    version="main@00043967",
    about="TensorRT-LLM main at commit 00043967",
    checked_against=(
        f"{TRTLLM}:tensorrt_llm/llmapi/llm_args.py@0004396720054fd8e205cbf616f21f0b57c6b412",
        f"{TRTLLM}:tensorrt_llm/_torch/speculative/ngram.py@0249976575050d2c624a5f285683c66de311a3b7",
    ),
    fields=(
        Field("decoding_type", str, choices=("Draft_Target", "NGram"), required=True),
        Field("max_draft_len", int, low=1, required=True),
        Field("speculative_model", str),
        # NGramDecodingConfig: max_matching_ngram_size PositiveInt (default 2), is_keep_all,
        # is_use_oldest, is_public_pool bool (default True)
        Field("max_matching_ngram_size", int, low=1),
        Field("is_keep_all", bool),
        Field("is_use_oldest", bool),
        Field("is_public_pool", bool),
    ),
    forbid_extra=True,  # StrictBaseModel: extra="forbid"
    rules=(
        Rule(
            # DraftTargetDecodingConfig.validate_draft_target_config
            "decoding_type Draft_Target needs speculative_model",
            lambda s: s["decoding_type"] != "Draft_Target" or "speculative_model" in s,
        ),
    ),
    notes=(
        "Draft_Target drafts a linear chain (max_total_draft_tokens = max_draft_len), PyTorch "
        "backend; trees refused",
        "ngram domains: decoding_type NGram (linear chain, PyTorch backend only), TensorRT-LLM's "
        "own rule (see approximation)",
        "early-exit domains refused: TensorRT-LLM has no early-exit drafter",
    ),
    drafters=("draft-model", "ngram"),
)

VERSIONS = (MAIN_00043967,)
EXPORTS = (
    "per domain: `speculative_config` `{decoding_type: Draft_Target, max_draft_len: K, "
    "speculative_model}` (no `eagle_choices`); ngram domains: `{decoding_type: NGram, "
    "max_draft_len: K, max_matching_ngram_size: prompt_lookup_max, is_public_pool: false, ...}`, "
    "**approximated** (TensorRT-LLM's pool rule is not vLLM's)"
)
REFUSES = (
    "trees: `eagle_choices` removed (PR #18210); dynamic trees are for EAGLE-3/MTP heads "
    "and do not keep a fixed shape; early-exit domains (no early-exit drafter)"
)


def export(plan: DeploymentPlan, options: ExportOptions, version: EngineVersion) -> dict:
    domains, approximated = {}, []
    for domain in plan.domains:
        entry = domain.summary
        if domain.shape is None:
            domains[domain.domain] = {**entry, "speculative_config": None}
            continue
        check_drafter(domain, version, VERSIONS, MISSING)
        ngram = domain.drafter.kind == "ngram"
        k = chain_length(
            domain.shape,
            f"TensorRT-LLM ({'NGram' if ngram else 'Draft_Target'})",
            f"domain {domain.domain!r}",
            "tune chains only (specscope tune --max-rank 1): eagle_choices was removed (PR #18210)",
        )
        if ngram:
            approximated.append(domain.domain)
            config = {
                "decoding_type": "NGram",
                "max_draft_len": k,
                "max_matching_ngram_size": domain.drafter.params["prompt_lookup_max"],
                "is_keep_all": True,
                "is_use_oldest": True,  # the earliest continuation, as vLLM's rule
                "is_public_pool": False,  # this request's tokens only, as vLLM's rule
            }
        else:
            config = {
                "decoding_type": "Draft_Target",
                "max_draft_len": k,
                "speculative_model": need(
                    options.draft, "--draft", "trtllm", "the draft model directory"
                ),
            }
        domains[domain.domain] = {
            **entry,
            "approximated": ngram,
            "speculative_config": version.validate(config, f"domain {domain.domain!r}"),
        }
    return {
        "deployment": "one TensorRT-LLM server per domain (the LLM API's speculative_config "
        "for the target); route each request to its domain's server",
        "approximation": (
            f"{', '.join(approximated)}: {NGRAM_APPROXIMATION}" if approximated else None
        ),
        "domains": domains,
    }
