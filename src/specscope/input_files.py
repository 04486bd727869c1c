"""The files users hand in, each with its schema: the registry that the reference page of input
files (``docs/reference/input-files.md``, its JSON Schemas generated here) and the schema tests
read.

Each entry names the schema (:mod:`specscope.schemas` validates data against it), the error its
reader raises, and a small valid example. Reads no file and validates nothing itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import SpecscopeError
from .prompts.items import PromptLine, PromptSourceError
from .run.config import RunConfig, RunConfigError
from .schemas import json_schema
from .serving.gateway.deployment import DeploymentError, DeploymentFile
from .serving.gateway.metrics import MetricsError, PolicyPredictions
from .sweep.grid import SweepError, SweepFile
from .tune.acceptance import PolicyError
from .tune.costs import CostModel


@dataclass(frozen=True)
class InputFile:
    """One kind of file a user hands in."""

    title: str
    read_by: str  # the commands and options that read it
    schema: Any  # a dataclass or a pydantic model
    error: type[SpecscopeError]
    example: dict  # a small valid instance, as the file holds it


INPUT_FILES: dict[str, InputFile] = {
    "run-config": InputFile(
        "Run config (TOML)",
        "`specscope run --config FILE`, a sweep's `base`",
        RunConfig,
        RunConfigError,
        {
            "tree": {"policy": "chain", "depth": 3},
            "prompts": {"domains": ["code", "chat"], "per_domain": 2},
            "max_new_tokens": 16,
            "criteria": {"top_m": 2, "tree_m": [1, 2]},
            "drafter": {"kind": "ngram", "prompt_lookup_max": 3},
        },
    ),
    "sweep": InputFile(
        "Sweep file (TOML)",
        "`specscope sweep FILE`",
        SweepFile,
        SweepError,
        {
            "base": "demo",
            "trees": ["paper", {"policy": "chain", "depth": [2, 3]}],
            "execution": {"prompts_per_shard": 4, "batch_size": 2},
        },
    ),
    "prompts-line": InputFile(
        "A line of a prompts file (JSONL)",
        "`specscope run --prompts FILE`, `tune`, `bench`, `ingest --prompts`",
        PromptLine,
        PromptSourceError,
        {"id": "q1", "domain": "math", "prompt": "What is 2 + 2?"},
    ),
    "deployment": InputFile(
        "Deployment file (TOML)",
        "`specscope gateway FILE`",
        DeploymentFile,
        DeploymentError,
        {
            "engine": "llama.cpp",
            "fallback": {"url": "http://127.0.0.1:8080", "model": "plain"},
            "domains": {"code": {"url": "http://127.0.0.1:8080", "model": "code"}},
            "vllm_compatible_metrics": False,
        },
    ),
    "policy-predictions": InputFile(
        "What the gateway reads of a policy file (JSON)",
        "`specscope gateway --policy-file FILE`",
        PolicyPredictions,
        MetricsError,
        {"domains": {"code": {"expected_tau": 2.4, "expected_tau_low": 2.2}}, "uniform": "none"},
    ),
    "cost-model": InputFile(
        "Cost model (JSON)",
        "`specscope tune --costs FILE`",
        CostModel,
        PolicyError,
        {
            "draft_s": [[1, 0.004], [8, 0.006]],
            "target_s": [[1, 0.02], [9, 0.03]],
            "plain_token_s": 0.02,
        },
    ),
}


def input_files_markdown() -> str:
    """The reference page of input files: for each, what reads it, an example and its JSON
    Schema (generated from the schema the reader validates with)."""
    out = [
        "# Input files",
        "",
        "Every file you hand to specscope is checked against its schema when it is read: a value",
        'of the wrong type (`"3"` where an integer belongs, `"true"` where a boolean does), a',
        "missing key or an unknown one is refused in one line that names the file (or its line),",
        "the key, the value and what is allowed. Each schema below is generated from the one the",
        "reader validates with (`python scripts/cli_reference.py` writes this page).",
        "",
    ]
    for name, entry in INPUT_FILES.items():
        schema = json.dumps(json_schema(entry.schema), indent=2)
        out += [
            f"## {entry.title} {{#{name}}}",
            "",
            f"Read by {entry.read_by}. An example, as JSON:",
            "",
            f"```json\n{json.dumps(entry.example)}\n```",
            "",
            '??? note "Its JSON Schema"',
            "",
            *(f"    {line}" if line else "" for line in ["```json", *schema.splitlines(), "```"]),
            "",
        ]
    return "\n".join(out)
