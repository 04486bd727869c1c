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
from .serving.aiperf import Record as AIPerfRecord
from .serving.gateway.deployment import DeploymentError, DeploymentFile
from .serving.gateway.metrics import MetricsError, PolicyPredictions
from .serving.llamacpp.costs import CostGridFile
from .serving.llamacpp.ingest import Timings
from .serving.request_stats import IngestError
from .serving.sglang.ingest import MetaInfo
from .serving.specbench import Answer
from .serving.vllm.ingest import SpecDecodingMetrics
from .sweep.grid import SweepError, SweepFile
from .tune.acceptance import PolicyError
from .tune.costs import CostModel
from .tune.policy import PolicyDocument


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
    "llama-cost-grid": InputFile(
        "llama.cpp cost grid (JSON)",
        "`specscope tune --backend llama-server --cost-grid FILE`",
        CostGridFile,
        SpecscopeError,
        {
            "format": "specscope-llama-costs/1",
            "curves": [
                {
                    "role": "target",
                    "quant": "Q4_K_M",
                    "model": "target.gguf",
                    "threads": 2,
                    "poll": 50,
                    "batch": 2048,
                    "ubatch": 512,
                    "depth": 0,
                    "seconds": [[1, 0.047], [2, 0.083]],
                    "stddev": [[1, 0.001], [2, 0.002]],
                }
            ],
        },
    ),
    "policy": InputFile(
        "Policy file (JSON, or TOML by hand)",
        "`specscope decode` and `bench --policy-file FILE`, `export POLICY`",
        PolicyDocument,
        PolicyError,
        {
            "domains": {
                "code": {"tree": "[(0,), (0, 0), (0, 0, 0)]"},
                "chat": {"tree": "[(0,)]", "drafter": {"kind": "ngram", "prompt_lookup_max": 3}},
            },
            "uniform": "none",
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
    "vllm-record": InputFile(
        "vLLM's statistics of an answer (`metrics.speculative_decoding`, in an engine log)",
        "`specscope ingest LOG --format vllm`, `specscope gateway` (engine `vllm`)",
        SpecDecodingMetrics,
        IngestError,
        {
            "num_spec_steps": 4,
            "num_accepted_draft_tokens": 5,
            "num_draft_tokens": 12,
            "num_spec_tokens": 3,
            "acceptance_histogram": [1, 1, 1, 1],
        },
    ),
    "sglang-record": InputFile(
        "SGLang's statistics of an answer (`meta_info` of /generate, in an engine log)",
        "`specscope ingest LOG --format sglang`, `specscope gateway` (engine `sglang`)",
        MetaInfo,
        IngestError,
        {
            "id": "5799660f",
            "completion_tokens": 9,
            "spec_verify_ct": 3,
            "spec_num_correct_drafts": 5,
            "spec_num_proposed_drafts": 9,
            "spec_correct_drafts_histogram": [0, 1, 2],
        },
    ),
    "llamacpp-record": InputFile(
        "llama-server's statistics of an answer (`timings`, in an engine log)",
        "`specscope ingest LOG --format llama.cpp`, `specscope gateway` (engine `llama.cpp`)",
        Timings,
        IngestError,
        {"predicted_n": 16, "predicted_ms": 210.5, "draft_n": 12, "draft_n_accepted": 11},
    ),
    "spec-bench-record": InputFile(
        "A line of a Spec-Bench answer file (JSONL)",
        "`specscope ingest LOG --format spec-bench`",
        Answer,
        IngestError,
        {"question_id": 81, "choices": [{"index": 0, "accept_lengths": [1, 3, 2]}]},
    ),
    "aiperf-record": InputFile(
        "A line of AIPerf's `profile_export.jsonl` (JSONL)",
        "`specscope ingest LOG --format aiperf`",
        AIPerfRecord,
        IngestError,
        {
            "metadata": {
                "session_num": 0,
                "conversation_id": "q1",
                "turn_index": 0,
                "request_start_ns": 1,
                "request_end_ns": 2,
                "worker_id": "worker_0",
                "record_processor_id": "record_processor_0",
                "benchmark_phase": "profiling",
            },
            "metrics": {"spec_decode_steps": {"value": 4, "unit": "count"}},
            "spec_decode_acceptance": {
                "engine": "vllm",
                "mean_acceptance_length": 2.25,
                "draft_acceptance_rate": 0.4167,
                "acceptance_histogram": {"0": 1, "1": 1, "2": 1, "3": 1},
                "num_accepted_draft_tokens": 6,
                "num_draft_tokens": 12,
                "num_spec_steps": 4,
                "num_spec_tokens": 3,
                "completion_tokens": 11,
            },
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
