"""SGLang: server flags per domain (``--speculative-algorithm STANDALONE`` with the draft model, or
``NGRAM`` for an ngram domain), with SGLang's node-budget rule checked, and its approximations said.

A chain (``--speculative-eagle-topk 1``) is drafted as exported: SGLang sets
``--speculative-num-draft-tokens`` to ``steps + 1``. A tree (topk > 1) is not drafted in the
exported shape: SGLang grows a dynamic EAGLE-2 tree, expanding the ``topk`` best nodes per level
and keeping the best ``num_draft_tokens - 1`` of ``topk + (steps - 1) * topk^2`` candidates by the
draft's scores (python/sglang/srt/speculative/eagle_utils.py ``organize_draft_results``). The
export keeps the tree's depth, branching and node budget, refuses a budget above the candidate
count (``torch.topk`` fails at run time), and says it approximates.

SGLang's NGRAM is not the rule specscope measured for an ngram domain (vLLM's): it drafts from a
trie of recent token windows shared by every request (python/sglang/kernels/jit/csrc/ngram_corpus/
trie.cpp), with no minimum or maximum match length to set; it inserts only each request's last
``--speculative-ngram-max-trie-depth`` (18) tokens after each step, and pads every draft to the
node budget and verifies it, so a step without a match costs a full verify. The export maps the
chain's K to its node budget, asks for a chain (BFS breadth 1) in recency order, and says all of
this and that the measured acceptance is vLLM's rule's. SGLang has no early-exit drafter: such a
domain is refused. It starts no server.
"""

from __future__ import annotations

from ..export_plan import (
    MEASURED_NGRAM,
    DeploymentPlan,
    DomainPlan,
    ExportOptions,
    check_drafter,
    need,
)
from ..export_rules import EngineVersion, Field, Rule

SGLANG = "sgl-project/sglang"
# the algorithms main@469c63e5 was recorded with
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")
# sglang 0.5.23, python/sglang/srt/speculative/spec_info.py SpeculativeAlgorithm (NEXTN: an alias
# of EAGLE, from_string)
ALGORITHMS_0_5_23 = (*ALGORITHMS, "UNO", "FROZEN_KV_MTP")


def candidates(steps: int, topk: int) -> int:
    """Draft tokens SGLang scores per step: topk at the first level, topk^2 at each later one."""
    return topk + (steps - 1) * topk * topk


def _budget_ok(s: dict) -> bool:
    if s["--speculative-algorithm"] != "STANDALONE":
        return True
    steps, topk = s["--speculative-num-steps"], s["--speculative-eagle-topk"]
    ndt = s["--speculative-num-draft-tokens"]
    if topk == 1:
        return ndt == steps + 1
    return ndt - 1 <= candidates(steps, topk)


BUDGET_RULE = Rule(
    "topk 1: --speculative-num-draft-tokens = steps + 1; topk > 1: "
    "num-draft-tokens - 1 <= topk + (steps - 1) * topk^2 (the candidates scored)",
    _budget_ok,
)

APPROXIMATION = (
    "SGLang approximates trees: with --speculative-eagle-topk > 1 it grows a dynamic "
    "EAGLE-2 tree under the node budget (--speculative-num-draft-tokens - 1 nodes, the "
    "topk best nodes of each level expanded), chosen by the draft's scores each step, "
    "not the exported shape; chains (topk 1) are drafted as exported"
)
# sglang 0.5.23: python/sglang/kernels/jit/csrc/ngram_corpus/trie.cpp (Trie::insert: windows of
# max_trie_depth tokens from every request, LRU eviction; Trie::match: every suffix length up to
# max_trie_depth found in the trie; Trie::buildRecency: BFS from each match, longest first, children
# most recently used first, breadth from min to max_bfs_breadth by match depth, until
# draft_token_num nodes), ngram.cpp Ngram::batchMatch (one trie for all requests), param.h
# get_draft_token_num (--speculative-num-draft-tokens - 1 nodes).
# What enters the trie and what is verified, python/sglang/srt/speculative/ngram_worker.py (0.5.23
# lines 403-420 and 301-302; read here in doublewordai/sglang-upstream@5af0f1f7bee4, a copy of
# upstream's file, functions _update_ngram_corpus and _prepare_draft_tokens): after each verify
# step, put_ids = _efficient_concat_last_n(origin_input_ids, output_ids[-max_trie_depth:] + the
# step's accepted tokens, max_trie_depth), so only a request's last max_trie_depth tokens are
# inserted (the body of a long prompt never is); _prepare_draft_tokens asserts that every request
# gets num_draft_tokens tokens ("here we always enforce it"), and fillResult pads a short draft
# with token 0 (kernels/jit/csrc/ngram_corpus/result.cpp line 34, "zero padding to length", read
# at sgl-project/sglang@f58236f24fa7), so every step verifies the full node budget.
NGRAM_APPROXIMATION = (
    "SGLang's NGRAM is its own drafter, not vLLM's ngram rule: it matches every suffix "
    "length of the context (up to --speculative-ngram-max-trie-depth, 18 by default; "
    "prompt_lookup_min/max have no counterpart, so a 1-token match drafts) in one trie of the "
    "token windows of every request served (shared across requests, least recently used "
    "evicted), follows the most recently seen continuation (match type BFS), and fills "
    "--speculative-num-draft-tokens - 1 nodes: with breadth 1 a chain from the longest match, "
    "and where that chain ends early, nodes from shorter matches (which may branch). After "
    "each step it inserts only the last --speculative-ngram-max-trie-depth (18) tokens of each "
    "request into the trie (SGLang 0.5.23, speculative/ngram_worker.py 403-420), so the body "
    "of a prompt is never searched, only its last 18 tokens and the text generated since; and "
    "it pads every draft to the node budget with token 0 and always verifies it "
    "(ngram_worker.py 301-302, ngram_corpus/result.cpp 34), so a step without a match still "
    "costs a full verify of --speculative-num-draft-tokens tokens, where vLLM's rule drafts "
    "nothing and decodes one token; " + MEASURED_NGRAM
)
MISSING = {
    "early-exit": "SGLang has no early-exit drafter: none of its algorithms (EAGLE, EAGLE3, "
    "NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK, UNO, FROZEN_KV_MTP at 0.5.23) drafts with the "
    "target's own first layers; export this domain to transformers (assistant_early_exit), or "
    "tune it with the draft model or ngram",
}

# sglang 0.5.23, from its PyPI wheel (sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl, sha256
# 00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937; the wheel records no commit):
# python/sglang/srt/arg_groups/fields/spec.py (the Spec fields; arg_utils.py makes each field
# --name-with-dashes, --speculative-draft-model-path with the alias --speculative-draft-model;
# ngram fields speculative_ngram_{min,max}_bfs_breadth (1, 10), speculative_ngram_match_type
# Literal["BFS", "PROB"], speculative_ngram_max_trie_depth 18), speculative_hook.py (_handle_ngram:
# speculative_eagle_topk := speculative_ngram_max_bfs_breadth, num_draft_tokens default 12, steps
# := num_draft_tokens // topk; topk 1: num_draft_tokens := steps + 1), eagle_utils.py
# (organize_draft_results: torch.topk of num_draft_token - 1 over the scored candidates)
V0_5_23 = EngineVersion(
    engine="sglang",
    version="0.5.23",
    about="the release, from its PyPI wheel; STANDALONE and NGRAM read from its source",
    checked_against=(
        f"{SGLANG}:python/sglang/srt/arg_groups/fields/spec.py@v0.5.23",
        f"{SGLANG}:python/sglang/srt/arg_groups/speculative_hook.py@v0.5.23",
        f"{SGLANG}:python/sglang/srt/speculative/eagle_utils.py@v0.5.23",
        f"{SGLANG}:python/sglang/kernels/jit/csrc/ngram_corpus/trie.cpp@v0.5.23",
    ),
    fields=(
        Field("--speculative-algorithm", str, choices=ALGORITHMS_0_5_23, required=True),
        Field("--speculative-draft-model-path", str),
        Field("--speculative-num-steps", int, low=1),
        Field("--speculative-eagle-topk", int, low=1),
        Field("--speculative-num-draft-tokens", int, low=2, required=True),
        Field("--speculative-ngram-min-bfs-breadth", int, low=1),
        Field("--speculative-ngram-max-bfs-breadth", int, low=1),
        Field("--speculative-ngram-match-type", str, choices=("BFS", "PROB")),
    ),
    forbid_extra=True,  # argparse: an unknown flag stops the server
    rules=(
        Rule(
            "STANDALONE needs --speculative-draft-model-path, --speculative-num-steps and "
            "--speculative-eagle-topk",
            lambda s: (
                s["--speculative-algorithm"] != "STANDALONE"
                or all(
                    f in s
                    for f in (
                        "--speculative-draft-model-path",
                        "--speculative-num-steps",
                        "--speculative-eagle-topk",
                    )
                )
            ),
        ),
        BUDGET_RULE,
        Rule(
            # ngram.cpp Ngram::Ngram throws "min_bfs_breadth must be less than or equal to
            # max_bfs_breadth"
            "--speculative-ngram-min-bfs-breadth <= --speculative-ngram-max-bfs-breadth",
            lambda s: (
                s.get("--speculative-ngram-min-bfs-breadth", 1)
                <= s.get("--speculative-ngram-max-bfs-breadth", 10)
            ),
        ),
    ),
    approximation=APPROXIMATION,
    notes=(
        "one SGLang server per domain (no per-request speculation: SGLang RFC #30263 closed)",
        "NGRAM domains: SGLang's own n-gram drafter, not the rule specscope measured (see "
        "approximation); it needs a CUDA, CPU or XPU device and no DP attention, turns mixed "
        "chunked prefill off and, unless --max-running-requests is given, caps it at 48 "
        "(_handle_ngram in speculative_hook.py)",
        "early-exit domains refused: SGLang has no early-exit drafter",
    ),
    drafters=("draft-model", "ngram"),
)

# the rules of this version were recorded before the 0.5.23 check; its NGRAM settings were not read
MAIN_469C63E5 = EngineVersion(
    engine="sglang",
    version="main@469c63e5",
    about="SGLang main at commit 469c63e5",
    checked_against=(
        f"{SGLANG}:python/sglang/srt/server_args.py@469c63e54e7d94591617ef9590c6aa26d54dc1bb",
        f"{SGLANG}:python/sglang/srt/speculative/eagle_utils.py@263bc85d64baa38d82ec20f58a61f2982c78075d",
    ),
    fields=(
        Field("--speculative-algorithm", str, choices=ALGORITHMS, required=True),
        Field("--speculative-draft-model-path", str, required=True),
        Field("--speculative-num-steps", int, low=1, required=True),
        Field("--speculative-eagle-topk", int, low=1, required=True),
        Field("--speculative-num-draft-tokens", int, low=2, required=True),
    ),
    forbid_extra=True,  # argparse: an unknown flag stops the server
    rules=(BUDGET_RULE,),
    approximation=APPROXIMATION,
    notes=("one SGLang server per domain (no per-request speculation: SGLang RFC #30263 closed)",),
)

VERSIONS = (V0_5_23, MAIN_469C63E5)
EXPORTS = (
    "per domain: `--speculative-algorithm STANDALONE`, `--speculative-draft-model-path`, "
    "`--speculative-num-steps` (depth), `--speculative-eagle-topk` (branching), "
    "`--speculative-num-draft-tokens` (nodes + 1); trees **approximated** by SGLang's "
    "dynamic tree under that node budget; ngram domains (0.5.23): `--speculative-algorithm "
    "NGRAM`, `--speculative-num-draft-tokens` K + 1, BFS breadth 1, match type BFS, "
    "**approximated** (SGLang's trie drafter is not vLLM's rule)"
)
REFUSES = (
    "a node budget above topk + (steps-1)·topk² (SGLang's `torch.topk` fails at run time); "
    "early-exit domains (SGLang has no early-exit drafter)"
)


def _standalone(domain: DomainPlan, options: ExportOptions) -> dict:
    shape = domain.shape
    return {
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": need(
            options.draft, "--draft", "sglang", "the draft model it should load"
        ),
        "--speculative-num-steps": shape.max_depth,
        "--speculative-eagle-topk": max(shape.ranks) + 1,  # children per node
        # tokens verified per step: the drafted nodes and the last accepted token
        "--speculative-num-draft-tokens": len(shape) + 1,
    }


def _ngram(domain: DomainPlan) -> dict:
    """A chain of K (the policy checked it is one): K drafted nodes, breadth 1, recency order."""
    return {
        "--speculative-algorithm": "NGRAM",
        "--speculative-num-draft-tokens": len(domain.shape) + 1,
        "--speculative-ngram-min-bfs-breadth": 1,
        "--speculative-ngram-max-bfs-breadth": 1,
        "--speculative-ngram-match-type": "BFS",
    }


def export(plan: DeploymentPlan, options: ExportOptions, version: EngineVersion) -> dict:
    domains = {}
    approximated: dict[str, list[str]] = {}  # approximation -> the domains it applies to
    for domain in plan.domains:
        entry = domain.summary
        if domain.shape is None:
            domains[domain.domain] = {**entry, "flags": {}, "serve_args": []}
            continue
        check_drafter(domain, version, VERSIONS, MISSING)
        if domain.drafter.kind == "ngram":
            flags, approximation = _ngram(domain), NGRAM_APPROXIMATION
        else:
            flags = _standalone(domain, options)
            approximation = APPROXIMATION if flags["--speculative-eagle-topk"] > 1 else None
        version.validate(flags, f"domain {domain.domain!r}")
        if approximation:
            approximated.setdefault(approximation, []).append(domain.domain)
        domains[domain.domain] = {
            **entry,
            "approximated": approximation is not None,
            "flags": flags,
            "serve_args": [str(x) for kv in flags.items() for x in kv],
        }
    return {
        "deployment": "one SGLang server per domain (python -m sglang.launch_server --model-path "
        "TARGET ...flags); route each request to its domain's server",
        "approximation": "; ".join(f"{', '.join(ds)}: {a}" for a, ds in approximated.items())
        or None,
        "domains": domains,
    }
