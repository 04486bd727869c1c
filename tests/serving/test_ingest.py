"""specscope ingest: engines' documented per-request formats, literal expected figures, and the
false-positive rate of the one step-level finding on logs of known truth."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specscope.analysis.stepwise import (
    analyze_ingested,
    synthetic_requests,
    verdict_rate,
)
from specscope.cli import app
from specscope.serving.ingest import IngestError, ingest, read_log

# vLLM --per-request-spec-decode-metrics detailed, as an OpenAI-API response
VLLM_DETAILED = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [],
    "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
    "metrics": {
        "speculative_decoding": {
            "mean_acceptance_length": 2.0,
            "draft_acceptance_rate": 1 / 3,
            "acceptance_histogram": [1, 1, 0, 1],
            "num_spec_steps": 3,
            "num_accepted_draft_tokens": 4,
            "num_draft_tokens": 9,
            "num_spec_tokens": 3,
            "per_step_accepted": [0, 1, 3],
            "per_step_drafted": [3, 3, 3],
        }
    },
}
# the same in summary mode, inside a streaming chunk's "data" envelope (54 tokens: 1 from the
# prefill + 43 verify steps x (accepted + 1); fewer would be refused as impossible)
VLLM_SUMMARY = {
    "data": {
        "id": "chatcmpl-2",
        "choices": [],
        "usage": {"completion_tokens": 54},
        "metrics": {
            "speculative_decoding": {
                "mean_acceptance_length": 1.2325581395348837,
                "draft_acceptance_rate": 0.07751937984496124,
                "acceptance_histogram": [39, 1, 0, 3],
                "num_spec_steps": 43,
                "num_accepted_draft_tokens": 10,
                "num_draft_tokens": 129,
                "num_spec_tokens": 3,
            }
        },
    }
}
SGLANG = {
    "text": "...",
    "meta_info": {
        "id": "5799660f",
        "prompt_tokens": 12,
        "completion_tokens": 41,
        "spec_verify_ct": 16,
        "spec_accept_length": 2.5625,
    },
}
LLAMACPP = {
    "content": "...",
    "id_slot": 0,
    "timings": {"prompt_n": 12, "predicted_n": 64, "draft_n": 60, "draft_n_accepted": 33},
}
SPEC_BENCH = {
    "question_id": 81,
    "category": "writing",
    "answer_id": "x",
    "model_id": "eagle",
    "choices": [
        {
            "index": 0,
            "turns": ["..."],
            "decoding_steps": [4],
            "new_tokens": [10],
            "wall_time": [0.5],
            "accept_lengths": [3, 1, 4, 2],
        }
    ],
}


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_each_format_gives_steps_and_accepted_tokens(tmp_path):
    cases = {
        "vllm": (
            [VLLM_DETAILED, VLLM_SUMMARY],
            [("chatcmpl-1", 3, 4, 9), ("chatcmpl-2", 43, 10, 129)],
        ),
        # SGLang: 41 tokens = 1 from the prefill + 16 verify steps x (accepted + 1)
        "sglang": ([SGLANG], [("5799660f", 16, 24, None)]),
        # llama.cpp without draft_n_verif_steps: 64 = 1 + steps + 33
        "llama.cpp": ([LLAMACPP | {"id": "r1"}], [("r1", 30, 33, 60)]),
        "spec-bench": ([SPEC_BENCH], [("81", 4, 6, None)]),
    }
    for fmt, (lines, expected) in cases.items():
        got = read_log(_write(tmp_path / f"{fmt}.jsonl", lines), fmt)
        assert [(pid, s.steps, s.accepted, s.drafted) for pid, s in got] == expected, fmt
    (_, detailed), _ = read_log(tmp_path / "vllm.jsonl", "vllm")
    assert detailed.per_step_accepted == (0, 1, 3) and detailed.per_step_drafted == (3, 3, 3)
    verif = read_log(
        _write(
            tmp_path / "v.jsonl",
            [{"id": "r", "timings": LLAMACPP["timings"] | {"draft_n_verif_steps": 28}}],
        ),
        "llama.cpp",
    )
    assert verif[0][1].steps == 28


def test_ingest_writes_a_run_that_analyze_reads(tmp_path):
    prompts = _write(
        tmp_path / "prompts.jsonl",
        [
            {"id": f"p{i}", "domain": d, "prompt": f"question {i}"}
            for i, d in enumerate(["code"] * 3 + ["chat"] * 3)
        ],
    )
    lines = []
    for i in range(6):  # code accepts more: 2.0 vs 1.5 tokens per step
        accepted = [1, 1, 1, 1] if i < 3 else [1, 0, 1, 0]
        lines.append(
            {
                "prompt_id": f"p{i}",
                "response": {
                    "id": f"req-{i}",
                    "metrics": {
                        "speculative_decoding": {
                            "num_spec_steps": 4,
                            "num_accepted_draft_tokens": sum(accepted),
                            "num_draft_tokens": 8,
                            "per_step_accepted": accepted,
                            "per_step_drafted": [2, 2, 2, 2],
                        }
                    },
                },
            }
        )
    log = _write(tmp_path / "vllm.jsonl", lines)
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "ingest",
            str(log),
            "--format",
            "vllm",
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    assert len(steps) == 24 and steps["tau"].tolist()[:4] == [2, 2, 2, 2]
    result = runner.invoke(app, ["analyze", str(tmp_path / "run"), "--boot", "200"])
    assert result.exit_code == 0, result.output
    analysis = json.loads((tmp_path / "run" / "analysis" / "analysis.json").read_text())
    rows = {d["domain"]: d for d in analysis["domains"]}
    assert rows["code"]["tokens_per_step"]["value"] == pytest.approx(2.0)
    assert rows["chat"]["tokens_per_step"]["value"] == pytest.approx(1.5)
    assert rows["code"]["draft_acceptance"]["value"] == pytest.approx(0.5)
    assert analysis["finding"]["verdict"] == "not testable"  # 3 prompts per domain
    assert "node records" in result.output


def test_bad_lines_are_one_line_errors_and_write_nothing(tmp_path):
    prompts = _write(
        tmp_path / "prompts.jsonl", [{"id": "chatcmpl-1", "domain": "code", "prompt": "x"}]
    )
    out = tmp_path / "run"
    cases = [
        ("vllm", [{"id": "chatcmpl-1", "metrics": {}}], "no metrics.speculative_decoding"),
        (
            "vllm",
            [{"id": "chatcmpl-1", "metrics": {"speculative_decoding": {"num_spec_steps": 2}}}],
            "missing field 'num_accepted_draft_tokens'",
        ),
        (
            "sglang",
            [{"meta_info": {"id": "chatcmpl-1", "spec_verify_ct": "3", "completion_tokens": 9}}],
            "field 'spec_verify_ct' must be a non-negative integer",
        ),
        (
            "spec-bench",
            [{"question_id": 1, "choices": [{"accept_lengths": [0, 2]}]}],
            "accept_lengths must be a list of integers >= 1",
        ),
        ("vllm", [VLLM_SUMMARY], "request 'chatcmpl-2' of .* has no prompt"),
        (
            "tgi",
            [VLLM_DETAILED],
            "unknown format 'tgi'; allowed: vllm, sglang, llama.cpp, spec-bench",
        ),
    ]
    for fmt, lines, message in cases:
        with pytest.raises(IngestError, match=message):
            ingest(_write(tmp_path / "log.jsonl", lines), fmt, prompts, out)
        assert not out.exists()
    _write(tmp_path / "log.jsonl", [{"id": "chatcmpl-1", "metrics": {}}])
    result = CliRunner().invoke(
        app,
        ["ingest", str(tmp_path / "log.jsonl"), "-f", "vllm", "-p", str(prompts), "-o", str(out)],
    )
    assert result.exit_code == 2 and result.output.startswith("error: ")
    assert len(result.output.strip().splitlines()) == 1


def test_domain_difference_false_positive_rate_and_power():
    # nominal 5% (two-sided, Bonferroni over 6 pairs); 150 runs: allow 3 standard errors
    reps = 150
    false_positive = verdict_rate({d: 0.5 for d in "abcd"}, 12, reps, n_boot=200)
    assert false_positive <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps)
    assert verdict_rate({"a": 0.3, "b": 0.5, "c": 0.5, "d": 0.7}, 12, 40, n_boot=200) >= 0.9
    few = analyze_ingested(
        {}, synthetic_requests(np.random.default_rng(0), {"a": 0.3, "b": 0.7}, 9)
    )
    assert few.finding.verdict == "not testable"  # fewer than 10 prompts in a domain
