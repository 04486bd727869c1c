"""SGLang: server flags per domain (``--speculative-algorithm STANDALONE`` with the draft model),
with SGLang's node-budget rule checked, and its approximation of trees said.

A chain (``--speculative-eagle-topk 1``) is drafted as exported: SGLang sets
``--speculative-num-draft-tokens`` to ``steps + 1``. A tree (topk > 1) is not drafted in the
exported shape: SGLang grows a dynamic EAGLE-2 tree, expanding the ``topk`` best nodes per level
and keeping the best ``num_draft_tokens - 1`` of ``topk + (steps - 1) * topk^2`` candidates by the
draft's scores (python/sglang/srt/speculative/eagle_utils.py ``organize_draft_results``). The
export keeps the tree's depth, branching and node budget, refuses a budget above the candidate
count (``torch.topk`` fails at run time), and says it approximates. It starts no server.
"""

from __future__ import annotations

from .plan import DeploymentPlan, ExportOptions, need
from .rules import EngineVersion, Field, Rule

SGLANG = "sgl-project/sglang"
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")


def candidates(steps: int, topk: int) -> int:
    """Draft tokens SGLang scores per step: topk at the first level, topk^2 at each later one."""
    return topk + (steps - 1) * topk * topk


def _budget_ok(s: dict) -> bool:
    steps, topk = s["--speculative-num-steps"], s["--speculative-eagle-topk"]
    ndt = s["--speculative-num-draft-tokens"]
    if topk == 1:
        return ndt == steps + 1
    return ndt - 1 <= candidates(steps, topk)


APPROXIMATION = (
    "SGLang approximates trees: with --speculative-eagle-topk > 1 it grows a dynamic "
    "EAGLE-2 tree under the node budget (--speculative-num-draft-tokens - 1 nodes, the "
    "topk best nodes of each level expanded), chosen by the draft's scores each step, "
    "not the exported shape; chains (topk 1) are drafted as exported"
)

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
    rules=(
        Rule(
            "topk 1: --speculative-num-draft-tokens = steps + 1; topk > 1: "
            "num-draft-tokens - 1 <= topk + (steps - 1) * topk^2 (the candidates scored)",
            _budget_ok,
        ),
    ),
    takes_trees=True,
    approximation=APPROXIMATION,
    notes=("one SGLang server per domain (no per-request speculation: SGLang RFC #30263 closed)",),
)

VERSIONS = (MAIN_469C63E5,)
EXPORTS = (
    "per domain: `--speculative-algorithm STANDALONE`, `--speculative-draft-model-path`, "
    "`--speculative-num-steps` (depth), `--speculative-eagle-topk` (branching), "
    "`--speculative-num-draft-tokens` (nodes + 1); trees **approximated** by SGLang's "
    "dynamic tree under that node budget"
)
REFUSES = "a node budget above topk + (steps-1)·topk² (SGLang's `torch.topk` fails at run time)"


def export(plan: DeploymentPlan, options: ExportOptions, version: EngineVersion) -> dict:
    domains, approximated = {}, []
    for domain in plan.domains:
        entry = {"tree": domain.tree, "source": domain.source}
        shape = domain.shape
        if shape is None:
            domains[domain.domain] = {**entry, "flags": {}, "serve_args": []}
            continue
        topk = max(shape.ranks) + 1  # children per node
        flags = {
            "--speculative-algorithm": "STANDALONE",
            "--speculative-draft-model-path": need(
                options.draft, "--draft", "sglang", "the draft model it should load"
            ),
            "--speculative-num-steps": shape.max_depth,
            "--speculative-eagle-topk": topk,
            # tokens verified per step: the drafted nodes and the last accepted token
            "--speculative-num-draft-tokens": len(shape) + 1,
        }
        version.validate(flags, f"domain {domain.domain!r}")
        if topk > 1:
            approximated.append(domain.domain)
        domains[domain.domain] = {
            **entry,
            "approximated": topk > 1,
            "flags": flags,
            "serve_args": [str(x) for kv in flags.items() for x in kv],
        }
    return {
        "deployment": "one SGLang server per domain (python -m sglang.launch_server --model-path "
        "TARGET ...flags); route each request to its domain's server",
        "approximation": (
            f"{', '.join(approximated)}: {version.approximation}" if approximated else None
        ),
        "domains": domains,
    }
