"""vLLM: one ``--speculative-config`` per domain: method ``draft_model`` (a standalone draft chain)
or, for an ngram domain, method ``ngram`` with the measured ``prompt_lookup_min``/``max`` (the rule
specscope's ngram drafter re-implements). vLLM has no early-exit drafter: such a domain is refused.

Trees are refused: vLLM removed ``speculative_token_tree`` and tree attention (PR #42121, merged
2026-05; tree PRs were closed in 2026-06 as "no longer supported") and its ``SpeculativeConfig`` forbids
unknown keys, so a tree makes the server refuse to start; before that, trees were drafted only by
EAGLE heads (``method`` eagle/eagle3), not by the standalone draft model specscope measures.

No ``num_speculative_tokens_per_batch_size``: a K per batch size would have to be priced by
replays and vLLM's own step costs at each batch size, which specscope does not measure (its cost
model times its own decoder's passes on one sequence); the domain's K is the one setting written,
and its entry's ``priced_on`` says what that K was priced on (the policy's predicted tokens per
step over its cost model, at batch size 1) or that it was not priced. Two versions are checked:
main@002e77c1 (trees removed) and main@f19b16d9 (``speculative_token_tree`` still a field). This
module writes settings; it starts no server.
"""

from __future__ import annotations

import json

from ..export_plan import (
    DeploymentPlan,
    DomainPlan,
    ExportOptions,
    chain_length,
    check_drafter,
    need,
)
from ..export_rules import EngineVersion, Field, Rule

VLLM = "vllm-project/vllm"
# SpeculativeMethod at 002e77c1, less its MTP model types (specscope exports draft_model only)
METHODS = (
    "ngram",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "suffix",
    "custom_class",
    "eagle",
    "eagle3",
    "extract_hidden_states",
    "dflash",
    "ngram_gpu",
    "dspark",
)


# the fields of each method specscope writes (SpeculativeConfig.__post_init__ at both commits:
# method ngram with num_speculative_tokens and no model sets model "ngram" itself; a
# draft_model without a model raises "num_speculative_tokens was provided but without
# speculative model"; prompt_lookup_min > prompt_lookup_max raises)
METHOD_RULES = (
    Rule(
        "method draft_model needs model (the draft model to load)",
        lambda s: s.get("method") != "draft_model" or "model" in s,
    ),
    Rule(
        "prompt_lookup_min <= prompt_lookup_max",
        lambda s: s.get("prompt_lookup_min", 0) <= s.get("prompt_lookup_max", 2**31),
    ),
)
# vllm/config/speculative.py (both commits): prompt_lookup_max/prompt_lookup_min are
# "int | None = Field(default=None, ge=1)", read by method ngram only. Read again at
# f19b16d95e4395790661f4835e4436bc3dd5d9c7: SpeculativeConfig's method, model,
# num_speculative_tokens (gt=0), prompt_lookup_min/max (ge=1), and no
# num_speculative_tokens_per_batch_size (later vLLM's batch-size schedule, which this export
# does not write: it is not priced, see the module docstring)
NGRAM_FIELDS = (
    Field("prompt_lookup_min", int, low=1),
    Field("prompt_lookup_max", int, low=1),
)
# Which n-gram rule runs depends on the model runner. The V2 runner (vLLM's default since 0.33)
# builds NgramGPUSpeculator (vllm/v1/worker/gpu/spec_decode/ngram/speculator.py@b4f1db99): its
# scan keeps the longest n and then the RIGHTMOST occurrence ("Pack (n, pos) so a single max
# yields longest-n, rightmost-pos"), and it always drafts K slots, filling slots past a short copy
# or a miss with the last sampled token, which are verified as ordinary drafts ("Invalid slots
# fall back to the last sampled token"). Only the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0) runs
# NgramProposer, whose earliest-occurrence rule with no draft on a miss is what specscope's
# ngram drafter re-implements and measured. The export therefore sets the V1 runner.
NGRAM_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
NGRAM_NOTE = (
    "ngram domains: method ngram with the measured prompt_lookup_min/max, served with "
    "VLLM_USE_V2_MODEL_RUNNER=0 (the entry's env): the V1 runner's NgramProposer "
    "(vllm/v1/spec_decode/ngram_proposer.py of vLLM 0.33.0, 4ba787ec9) takes the earliest "
    "occurrence and drafts nothing on a miss, the rule specscope measured. On the default V2 "
    "runner, NgramGPUSpeculator (v1/worker/gpu/spec_decode/ngram/speculator.py@b4f1db99) takes "
    "the rightmost occurrence and always verifies K drafts, padding a miss or a short copy with "
    "the last token: acceptance and step cost then differ from the measurement (approximated)"
)
MISSING = {
    "early-exit": "vLLM has no early-exit drafter: none of its speculative methods (ngram, "
    "medusa, mlp_speculator, draft_model, suffix, eagle, eagle3, the MTP heads, ...) drafts "
    "with the target's own first layers; export this domain to transformers "
    "(assistant_early_exit), or tune it with the draft model or ngram",
}
METHOD = {"draft-model": "draft_model", "ngram": "ngram"}


MAIN_002E77C1 = EngineVersion(
    engine="vllm",
    version="main@002e77c1",
    about="vLLM main at commit 002e77c1, after PR #42121 removed trees",
    tree_reason="vLLM removed speculative_token_tree (PR #42121, merged 2026-05)",
    checked_against=(
        f"{VLLM}:vllm/config/speculative.py@002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443",
    ),
    fields=(
        Field("method", str, choices=METHODS, required=True),
        Field("model", str),
        Field("num_speculative_tokens", int, low=1, required=True),
        *NGRAM_FIELDS,
    ),
    forbid_extra=True,  # @config: pydantic extra="forbid"; speculative_token_tree is gone
    rules=METHOD_RULES,
    notes=(
        "trees refused: speculative_token_tree was removed (vLLM PR #42121, merged 2026-05) "
        "and unknown keys are refused; eagle/eagle3 need an EAGLE head, not the standalone draft specscope "
        "measured",
        "one vLLM server per domain (no per-request speculation length: vLLM #52258 open)",
        NGRAM_NOTE,
        "early-exit domains refused: vLLM has no early-exit drafter",
    ),
    drafters=("draft-model", "ngram"),
)

F19B16D9 = EngineVersion(
    engine="vllm",
    version="main@f19b16d9",
    about="vLLM main at commit f19b16d9, before PR #42121: speculative_token_tree still there",
    tree_reason="at this version vLLM drafted trees only with an EAGLE head (method eagle/eagle3) "
    "and the tree-attention backend, not with the standalone draft specscope measured",
    checked_against=(
        f"{VLLM}:vllm/config/speculative.py@f19b16d95e4395790661f4835e4436bc3dd5d9c7",
    ),
    fields=(
        Field(
            "method",
            str,
            choices=(
                "ngram",
                "medusa",
                "mlp_speculator",
                "draft_model",
                "suffix",
                "eagle",
                "eagle3",
                "mtp",
                "ngram_gpu",
            ),  # less MTP types
            required=True,
        ),
        Field("model", str),
        Field("num_speculative_tokens", int, low=1, required=True),
        *NGRAM_FIELDS,
    ),
    forbid_extra=True,  # @config: pydantic extra="forbid"
    rules=METHOD_RULES,
    notes=(
        "trees refused: speculative_token_tree needed an EAGLE head (eagle/eagle3) and the "
        "tree-attention backend, and drafted only trees with the same branching per level; "
        "specscope measured a standalone draft",
        "one vLLM server per domain (no per-request speculation length)",
        NGRAM_NOTE,
        "early-exit domains refused: vLLM has no early-exit drafter",
    ),
    drafters=("draft-model", "ngram"),
)

VERSIONS = (MAIN_002E77C1, F19B16D9)
EXPORTS = (
    "per domain: `--speculative-config` JSON with `method` draft_model, `model`, "
    "`num_speculative_tokens` K (no K per batch size: vLLM's batched step costs are not "
    "measured), and `priced_on`: what K was priced on (the policy's predicted tokens per step "
    "over its cost model, one sequence); ngram domains: `method` ngram, "
    "`prompt_lookup_min`, `prompt_lookup_max`, `num_speculative_tokens` K, served with "
    "`VLLM_USE_V2_MODEL_RUNNER=0` (the V1 proposer, the rule measured; V2's differs)"
)
REFUSES = (
    "trees: `speculative_token_tree` removed (PR #42121, merged 2026-05) and extra keys "
    "forbidden; earlier trees needed an EAGLE head, not a standalone draft; early-exit "
    "domains (vLLM has no early-exit drafter)"
)


def _priced_on(domain: DomainPlan) -> str:
    """What the domain's K was priced on: never vLLM's own step costs, nor a batch above one."""
    if domain.priced_on is None:
        return (
            "not priced: the policy records no prediction for this chain (not written by "
            "specscope tune); K is its length as the policy gives it"
        )
    return (
        f"{domain.priced_on}; vLLM's own step costs and batch sizes above 1 are not priced "
        "(no num_speculative_tokens_per_batch_size)"
    )


def _ngram_config(domain: DomainPlan, k: int) -> dict:
    """Method ngram: vLLM's proposer with the measured bounds; vLLM sets model "ngram" itself."""
    return {"method": "ngram", **domain.drafter.params, "num_speculative_tokens": k}


def export(plan: DeploymentPlan, options: ExportOptions, version: EngineVersion) -> dict:
    domains = {}
    for domain in plan.domains:
        where = f"domain {domain.domain!r}"
        entry = domain.summary
        if domain.shape is None:
            domains[domain.domain] = {**entry, "speculative_config": None, "serve_args": []}
            continue
        check_drafter(domain, version, VERSIONS, MISSING)
        entry = {**entry, "priced_on": _priced_on(domain)}
        k = chain_length(
            domain.shape,
            f"vLLM (method {METHOD[domain.drafter.kind]})",
            where,
            f"tune chains only (specscope tune --max-rank 1): {version.tree_reason}",
        )
        if domain.drafter.kind == "ngram":
            config = version.validate(_ngram_config(domain, k), where)
            domains[domain.domain] = {
                **entry,
                "speculative_config": config,
                "env": dict(NGRAM_ENV),
                "serve_args": ["--speculative-config", json.dumps(config)],
            }
            continue
        config = {
            "method": "draft_model",
            "model": need(
                options.draft,
                "--draft",
                "vllm",
                "the draft model it should load (a local path or a hub id)",
            ),
            "num_speculative_tokens": k,
        }
        version.validate(config, where)
        domains[domain.domain] = {
            **entry,
            "speculative_config": config,
            "serve_args": ["--speculative-config", json.dumps(config)],
        }
    return {
        "deployment": "one vLLM server per domain (vllm serve TARGET --speculative-config "
        "...; an ngram domain's server with its entry's env); route each request to its domain's "
        "server",
        "domains": domains,
    }
