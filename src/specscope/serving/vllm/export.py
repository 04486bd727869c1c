"""vLLM: one ``--speculative-config`` per domain: method ``draft_model`` (a standalone draft chain)
or, for an ngram domain, method ``ngram`` with the measured ``prompt_lookup_min``/``max`` (the rule
specscope's ngram drafter re-implements), and where the policy was tuned,
``num_speculative_tokens_per_batch_size`` from its cost model (draft-model domains only: the cost
model times the draft model's passes). vLLM has no early-exit drafter: such a domain is refused.

Trees are refused: vLLM removed ``speculative_token_tree`` and tree attention (PR #42121, merged
2026-05; tree PRs were closed in 2026-06 as "no longer supported") and its ``SpeculativeConfig`` forbids
unknown keys, so a tree makes the server refuse to start; before that, trees were drafted only by
EAGLE heads (``method`` eagle/eagle3), not by the standalone draft model specscope measures.

The batch-size schedule: specscope's cost model times draft and target passes by tokens fed; a
batch of ``b`` sequences drafting a chain of ``K`` feeds about ``b`` times the tokens of one. For
every batch size whose verify pass stays within the measured token counts, the K of best predicted
speed-up (0: no speculation) up to the domain's K; vLLM carries the last range's K to larger
batches and caps every K at ``num_speculative_tokens`` (vllm/v1/spec_decode/dynamic/utils.py).
Two versions are checked: main@002e77c1 (trees removed, the schedule field present) and
main@f19b16d9 (``speculative_token_tree`` still a field, no schedule). This module writes
settings; it starts no server.
"""

from __future__ import annotations

import json

from ...records.schema import ALL_DOMAINS
from ...trees import TreeShape
from ...tune.acceptance import AcceptanceVector
from ...tune.costs import CostModel, interpolate
from ..export_plan import (
    DeploymentPlan,
    DomainPlan,
    ExportOptions,
    chain_length,
    check_drafter,
    need,
)
from ..export_rules import EngineVersion, ExportError, Field, Rule

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


def _schedule_ok(s: dict) -> bool:
    """vLLM's validate_and_normalize_dynamic_sd_schedule, and K <= num_speculative_tokens."""
    table = s.get("num_speculative_tokens_per_batch_size")
    if table is None:
        return True
    if not isinstance(table, list) or not table:
        return False
    previous_end = 0
    for entry in sorted(table, key=lambda e: e[0]):
        if len(entry) != 3 or not all(isinstance(x, int) for x in entry):
            return False
        start, end, k = entry
        if start <= 0 or start > end or k < 0 or start <= previous_end:
            return False
        if k > s["num_speculative_tokens"]:
            return False
        previous_end = end
    return min(e[0] for e in table) == 1


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
# "int | None = Field(default=None, ge=1)", read by method ngram only
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
        f"{VLLM}:vllm/v1/spec_decode/dynamic/utils.py@a6f6bb1d3c1707ede85d03a7c7d47a105a1873fc",
    ),
    fields=(
        Field("method", str, choices=METHODS, required=True),
        Field("model", str),
        Field("num_speculative_tokens", int, low=1, required=True),
        Field("num_speculative_tokens_per_batch_size", list),
        *NGRAM_FIELDS,
    ),
    forbid_extra=True,  # @config: pydantic extra="forbid"; speculative_token_tree is gone
    rules=(
        *METHOD_RULES,
        Rule(
            "num_speculative_tokens_per_batch_size: [start, end, K] ranges from batch size 1, "
            "sorted, not overlapping, 0 <= K <= num_speculative_tokens",
            _schedule_ok,
        ),
    ),
    notes=(
        "trees refused: speculative_token_tree was removed (vLLM PR #42121, merged 2026-05) "
        "and unknown keys are refused; eagle/eagle3 need an EAGLE head, not the standalone draft specscope "
        "measured",
        "one vLLM server per domain (no per-request speculation length: vLLM #52258 open)",
        NGRAM_NOTE + "; no batch-size schedule for them (the cost model times the draft model)",
        "early-exit domains refused: vLLM has no early-exit drafter",
    ),
    drafters=("draft-model", "ngram"),
)

F19B16D9 = EngineVersion(
    engine="vllm",
    version="main@f19b16d9",
    about="vLLM main at commit f19b16d9, before PR #42121: speculative_token_tree still there, "
    "no batch-size schedule",
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
    "`num_speculative_tokens` K, and `num_speculative_tokens_per_batch_size` from the "
    "policy's cost model (tuned policies); ngram domains: `method` ngram, "
    "`prompt_lookup_min`, `prompt_lookup_max`, `num_speculative_tokens` K, served with "
    "`VLLM_USE_V2_MODEL_RUNNER=0` (the V1 proposer, the rule measured; V2's differs)"
)
REFUSES = (
    "trees: `speculative_token_tree` removed (PR #42121, merged 2026-05) and extra keys "
    "forbidden; earlier trees needed an EAGLE head, not a standalone draft; early-exit "
    "domains (vLLM has no early-exit drafter)"
)


def batch_schedule(costs: CostModel, acc: AcceptanceVector, k_max: int) -> list[list[int]] | None:
    """``[[start, end, K], ...]`` over the batch sizes whose verify pass of ``k_max + 1`` tokens per
    sequence lies within the measured token counts; None if not even batch size 1 does."""
    measured = costs.target_s[-1][0]
    b_max = measured // (k_max + 1)
    if b_max < 1:
        return None
    one = interpolate(costs.target_s, 1)
    best = []
    for b in range(1, b_max + 1):
        plain = costs.plain_token_s * interpolate(costs.target_s, b) / one  # b tokens per pass
        choice, speedup = 0, 1.0
        for k in range(1, k_max + 1):
            chain = TreeShape.chain(k)
            passes = (
                interpolate(costs.draft_s, b * costs.root_tokens)
                + (k - 1) * interpolate(costs.draft_s, b)
                + interpolate(costs.target_s, b * (k + 1))
            )
            step = costs.step_scale * passes + costs.overhead_s
            s = acc.expected_tau(chain) * plain / step
            if s > speedup:
                choice, speedup = k, s
        best.append(choice)
    ranges: list[list[int]] = []
    for b, k in enumerate(best, start=1):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = b
        else:
            ranges.append([b, b, k])
    return ranges


def _tuned(plan: DeploymentPlan, domain: DomainPlan) -> tuple[CostModel, AcceptanceVector] | None:
    if not plan.cost_model or not plan.acceptance:
        return None
    if not isinstance(plan.cost_model, dict):
        raise ExportError("policy cost_model must be a table (as specscope tune writes it)")
    key = domain.domain if domain.source == "policy" else ALL_DOMAINS
    entry = plan.acceptance.get(key) if isinstance(plan.acceptance, dict) else None
    if not entry:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("rates"), list):
        raise ExportError(
            f"policy acceptance[{key!r}] needs 'rates', a [depth][rank] list in "
            "[0, 1] (as specscope tune writes it)"
        )
    try:
        acc = AcceptanceVector.from_rates(entry["rates"])
    except (TypeError, ValueError) as e:
        raise ExportError(f"policy acceptance[{key!r}]: {e}") from None
    return CostModel.from_dict(plan.cost_model), acc


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
        tuned = (
            _tuned(plan, domain)
            if "num_speculative_tokens_per_batch_size" in version.field_names
            else None
        )
        if tuned is not None:
            table = batch_schedule(*tuned, k)
            if table is not None:
                config["num_speculative_tokens_per_batch_size"] = table
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
