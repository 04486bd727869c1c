"""specscope ingest: engines' documented per-request formats, literal expected figures, and the
false-positive rate of the one step-level finding on logs of known truth."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from lab.calibration import ingested_verdict_rate
from lab.synthetic import synthetic_requests
from specscope.analysis.stepwise import analyze_ingested
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
            r"metrics\.speculative_decoding\.num_accepted_draft_tokens is missing; give an integer",
        ),
        (
            "sglang",
            [{"meta_info": {"id": "chatcmpl-1", "spec_verify_ct": "3", "completion_tokens": 9}}],
            r"meta_info\.spec_verify_ct must be an integer or none, got '3'",
        ),
        (
            "spec-bench",
            [{"question_id": 1, "choices": [{"accept_lengths": [0, 2]}]}],
            r"choices\[0\]\.accept_lengths\[0\] must be an integer >= 1, got 0",
        ),
        ("vllm", [VLLM_SUMMARY], "request 'chatcmpl-2' of .* has no prompt"),
        (
            "tgi",
            [VLLM_DETAILED],
            "unknown format 'tgi'; allowed: vllm, sglang, llama.cpp, spec-bench, aiperf",
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
    false_positive = ingested_verdict_rate({d: 0.5 for d in "abcd"}, 12, reps, n_boot=200)
    assert false_positive <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps)
    assert (
        ingested_verdict_rate({"a": 0.3, "b": 0.5, "c": 0.5, "d": 0.7}, 12, 40, n_boot=200) >= 0.9
    )
    few = analyze_ingested(
        {}, synthetic_requests(np.random.default_rng(0), {"a": 0.3, "b": 0.7}, 9)
    )
    assert few.finding.verdict == "not testable"  # fewer than 10 prompts in a domain


# --- gateway logs: joined by each line's prompt_id (issue 37, review cases 21, 29, 100, 101) -------

GATEWAY_DOMAINS = ("code", "math", "chat", "reasoning")


def _gateway_timings(i):
    # prompt i: 10 + i tokens, i + 1 drafted, i // 2 accepted -> 9 + i - i // 2 verify steps
    return {"prompt_n": 14, "predicted_n": 10 + i, "draft_n": i + 1, "draft_n_accepted": i // 2}


def gateway_line(i, prompt_id=None, **extra):
    """A line of the gateway's request log for prompt ``i`` (llama-server behind it): every third
    answer streamed (the final chunk, with timings), the others whole; ``extra``: fields a newer
    gateway adds."""
    domain = GATEWAY_DOMAINS[i % 4]
    response = {
        "id": f"chatcmpl-{i}",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
        "system_fingerprint": "b6912-0c1e5709",
        "timings": _gateway_timings(i),
    }
    line = {
        "prompt_id": f"i{i}" if prompt_id is None else prompt_id,
        "domain": domain,
        "backend": "http://127.0.0.1:8081",
        "model": domain,
        "path": "/v1/chat/completions",
    }
    if i % 3 == 0:
        response |= {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        line["stream"] = True
    return line | extra | {"response": response}


def _gateway_prompts(tmp_path, n):
    return _write(
        tmp_path / "prompts.jsonl",
        [
            {"id": f"i{i}", "domain": GATEWAY_DOMAINS[i % 4], "prompt": f"question {i}"}
            for i in range(n)
        ],
    )


def test_a_concurrent_gateway_log_joins_every_line_to_its_own_prompt(tmp_path):
    # 200 requests answered in an order unlike the prompts file's (completion order), with the
    # fields a newer gateway adds (latency_s, status): each joins its own prompt by prompt_id
    import random

    order = list(range(200))
    random.Random(0).shuffle(order)
    assert sum(i == j for i, j in enumerate(order)) < 5  # nearly every line out of place
    log = _write(
        tmp_path / "gateway.jsonl",
        [gateway_line(i, latency_s=0.25 + i / 100, status=200) for i in order],
    )
    prompts = _gateway_prompts(tmp_path, 200)
    result = CliRunner().invoke(
        app,
        ["ingest", str(log), "-f", "llama.cpp", "-p", str(prompts), "-o", str(tmp_path / "run")],
    )
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    joined = {
        r.prompt_id: (r.domain, r.prompt_text, r.request_id, r.generated, r.drafted, r.accepted)
        for r in rows.itertuples()
    }
    assert joined == {
        f"i{i}": (
            GATEWAY_DOMAINS[i % 4],
            f"question {i}",
            f"chatcmpl-{i}",
            10 + i,
            i + 1,
            i // 2,
        )
        for i in range(200)
    }
    assert rows["prompt_id"].tolist() == [f"i{i}" for i in order]  # written in the log's order
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["join"] == "id" and manifest["engine_version"] == "b6912-0c1e5709"
    assert manifest["skipped"] == {"torn_last_line": None, "without_statistics": 0}
    assert manifest["warnings"] == []

    # --join order would join the n-th line to the n-th prompt (196 of 200 wrong): refused
    result = CliRunner().invoke(
        app,
        [
            "ingest",
            str(log),
            "-f",
            "llama.cpp",
            "-p",
            str(prompts),
            "-o",
            str(tmp_path / "by-order"),
            "--join",
            "order",
        ],
    )
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: {log}:1: the line carries prompt_id 'i{order[0]}': a log whose lines carry "
        "prompt ids is joined by them (--join id, the default); --join order is only for logs "
        "whose lines carry no id, as a log's lines are in the order the answers finished (the "
        "gateway's, under concurrency), not the prompts file's\n"
    )
    assert not (tmp_path / "by-order").exists()


def test_join_order_is_refused_on_the_first_line_with_a_prompt_id(tmp_path):
    # llama-server /completion responses carry no id; one line wrapped with a prompt_id among
    # them makes the order meaningless
    bare = {"stop": True, "timings": {"predicted_n": 5, "draft_n": 4, "draft_n_accepted": 3}}
    log = _write(tmp_path / "log.jsonl", [bare, {"prompt_id": 0, "response": bare}, bare])
    with pytest.raises(IngestError, match=r"log.jsonl:2: the line carries prompt_id '0'"):
        ingest(log, "llama.cpp", _gateway_prompts(tmp_path, 3), tmp_path / "run", join="order")
    assert not (tmp_path / "run").exists()


def test_ids_that_join_no_prompt_say_which_join_fits(tmp_path):
    prompts = _gateway_prompts(tmp_path, 3)
    # a gateway's client that sent no X-Prompt-Id: the gateway made an id up
    log = _write(tmp_path / "log.jsonl", [gateway_line(1, prompt_id="gw-0a1b2c3d4e5f-0")])
    with pytest.raises(IngestError) as error:
        ingest(log, "llama.cpp", prompts, tmp_path / "run")
    assert str(error.value) == (
        f"request 'gw-0a1b2c3d4e5f-0' of {log}:1 has no prompt in {prompts}: each line's "
        "prompt_id must be an id of the prompts file (the gateway writes the client's "
        "X-Prompt-Id header there, or an id of its own when the client sent none: send each "
        "prompt's id as X-Prompt-Id)"
    )
    # an engine's own id: order-join is advised only for a log in the prompts file's order
    log = _write(tmp_path / "log.jsonl", [gateway_line(1)["response"]])
    with pytest.raises(IngestError) as error:
        ingest(log, "llama.cpp", prompts, tmp_path / "run")
    assert str(error.value) == (
        f"request 'chatcmpl-1' of {log}:1 has no prompt in {prompts}: the engine's request id "
        'is no prompt id: wrap each line as {"prompt_id": ..., "response": ...}, or use '
        "--join order, which is right only when the log's lines are in the prompts file's "
        "order (one client sending the prompts one at a time, in that order; the gateway logs "
        "in completion order)"
    )
    assert not (tmp_path / "run").exists()


def test_a_utf8_prompt_id_joins_its_prompt(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps(
            {"id": "héllo-日本", "domain": "chat", "prompt": "こんにちは"}, ensure_ascii=False
        )
        + "\n",
        encoding="utf-8",
    )
    log = tmp_path / "gateway.jsonl"
    line = gateway_line(2, prompt_id="héllo-日本", latency_s=1.5, status=200)
    log.write_text(json.dumps(line, ensure_ascii=False) + "\n", encoding="utf-8")
    assert "héllo-日本".encode() in log.read_bytes()  # raw UTF-8, as the gateway writes it
    manifest = ingest(log, "llama.cpp", prompts, tmp_path / "run")
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rows[["prompt_id", "domain", "prompt_text", "generated"]].values.tolist() == [
        ["héllo-日本", "chat", "こんにちは", 12]
    ]
    assert manifest["counts"]["requests"] == 1


def test_a_retried_request_names_both_of_its_lines(tmp_path):
    log = _write(tmp_path / "log.jsonl", [gateway_line(1), gateway_line(2), gateway_line(1)])
    with pytest.raises(IngestError) as error:
        ingest(log, "llama.cpp", _gateway_prompts(tmp_path, 3), tmp_path / "run")
    assert str(error.value).startswith(
        f"request 'i1' of {log}:3 appears twice in {log} (first at {log}:1): "
    )
