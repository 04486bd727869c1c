"""TensorRT-LLM: a ``speculative_config`` per domain for the standalone draft model
(``decoding_type: Draft_Target``), a chain of ``max_draft_len`` tokens, without ``eagle_choices``.

The Draft_Target mode drafts a linear chain only (``max_total_draft_tokens = max_draft_len``,
tensorrt_llm/llmapi/llm_args.py ``DraftTargetDecodingConfig``); the config is a ``StrictBaseModel``
that refuses unknown fields. Trees are refused: ``eagle_choices`` was deprecated and then removed
(PR #18210), and the dynamic trees of the current config (``use_dynamic_tree``,
``dynamic_tree_max_topK``) belong to EAGLE-3/MTP heads, not to the standalone draft specscope
measures, and grow by the draft's scores rather than in a fixed shape. It starts no engine.
"""

from __future__ import annotations

from .plan import DeploymentPlan, ExportOptions, chain_length, need
from .rules import EngineVersion, Field

TRTLLM = "NVIDIA/TensorRT-LLM"

MAIN_00043967 = EngineVersion(
    engine="trtllm",
    version="main@00043967",
    about="TensorRT-LLM main at commit 00043967",
    checked_against=(
        f"{TRTLLM}:tensorrt_llm/llmapi/llm_args.py@0004396720054fd8e205cbf616f21f0b57c6b412",
    ),
    fields=(
        Field("decoding_type", str, choices=("Draft_Target",), required=True),
        Field("max_draft_len", int, low=1, required=True),
        Field("speculative_model", str, required=True),
    ),
    forbid_extra=True,  # StrictBaseModel: extra="forbid"
    notes=(
        "Draft_Target drafts a linear chain (max_total_draft_tokens = max_draft_len), PyTorch "
        "backend; trees refused",
    ),
)

VERSIONS = (MAIN_00043967,)
EXPORTS = (
    "per domain: `speculative_config` `{decoding_type: Draft_Target, max_draft_len: K, "
    "speculative_model}` (no `eagle_choices`)"
)
REFUSES = (
    "trees: `eagle_choices` removed (PR #18210); dynamic trees are for EAGLE-3/MTP heads "
    "and do not keep a fixed shape"
)


def export(plan: DeploymentPlan, options: ExportOptions, version: EngineVersion) -> dict:
    domains = {}
    for domain in plan.domains:
        entry = {"tree": domain.tree, "source": domain.source}
        if domain.shape is None:
            domains[domain.domain] = {**entry, "speculative_config": None}
            continue
        k = chain_length(
            domain.shape,
            "TensorRT-LLM (Draft_Target)",
            f"domain {domain.domain!r}",
            "tune chains only (specscope tune --max-rank 1): eagle_choices was removed (PR #18210)",
        )
        config = {
            "decoding_type": "Draft_Target",
            "max_draft_len": k,
            "speculative_model": need(
                options.draft, "--draft", "trtllm", "the draft model directory"
            ),
        }
        domains[domain.domain] = {
            **entry,
            "speculative_config": version.validate(config, f"domain {domain.domain!r}"),
        }
    return {
        "deployment": "one TensorRT-LLM server per domain (the LLM API's speculative_config "
        "for the target); route each request to its domain's server",
        "domains": domains,
    }
