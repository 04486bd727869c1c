"""specscope ingest against the shapes the engines' own code writes.

Each fixture is reproduced from the engine file named beside it (at the commit named), with the
values filled in by the code path the comment cites; expected figures are worked by hand.
"""

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specscope.cli import app
from specscope.serving.ingest import IngestError, ingest, load_histogram, read_log

# --- llama.cpp: tools/server (llama.cpp vendored by llama-cpp-python 0.3.36) ------------------------
# server-common.cpp server_slot_stats::to_json: draft_n / draft_n_accepted only if n_draft_tokens > 0.
# server-task.cpp to_json_non_oaicompat (/completion): no "id", "id_slot", "stop": true, "timings".


def _llama_timings(predicted_n, draft=None):
    timings = {
        "cache_n": 0,
        "prompt_n": 14,
        "prompt_ms": 80.1,
        "prompt_per_token_ms": 5.7,
        "prompt_per_second": 174.8,
        "predicted_n": predicted_n,
        "predicted_ms": 400.0,
        "predicted_per_token_ms": 25.0,
        "predicted_per_second": 40.0,
    }
    if draft is not None:
        timings["draft_n"], timings["draft_n_accepted"] = draft
    return timings


def llama_completion(predicted_n, draft=None, content="x"):
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": "qwen2.5-coder-1.5b",
        "tokens_predicted": predicted_n,
        "tokens_evaluated": 14,
        "generation_settings": {"n_predict": 16},
        "prompt": "",
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": 29,
        "timings": _llama_timings(predicted_n, draft),
    }


def llama_chat(predicted_n, draft=None, fingerprint="b6912-0c1e5709"):
    # server-task.cpp to_json_oaicompat_chat: id chatcmpl-..., system_fingerprint
    # llama_build_info(), usage, and "timings" when stats are set
    return {
        "choices": [
            {
                "finish_reason": "length",
                "index": 0,
                "message": {"role": "assistant", "content": "x"},
            }
        ],
        "created": 1764000000,
        "model": "qwen",
        "system_fingerprint": fingerprint,
        "object": "chat.completion",
        "id": "chatcmpl-abc",
        "usage": {
            "completion_tokens": predicted_n,
            "prompt_tokens": 14,
            "total_tokens": predicted_n + 14,
        },
        "timings": _llama_timings(predicted_n, draft),
    }


PROMPTS = [
    {"id": "code-0", "domain": "code", "prompt": "def add(a, b):"},
    {"id": "chat-0", "domain": "chat", "prompt": "hi"},
]


def _write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _prompts(tmp_path, prompts=PROMPTS):
    return _write(tmp_path / "prompts.jsonl", prompts)


def test_llamacpp_completion_responses_join_by_order_and_no_draft_n_is_no_drafting(tmp_path):
    # 16 tokens: 1 from the prefill, 15 from verify steps accepting 11 drafts -> 4 steps (derived);
    # the second reply drafted nothing (no draft_n): 0 verify steps, not an error.
    log = _write(tmp_path / "log.jsonl", [llama_completion(16, (12, 11)), llama_completion(1)])
    with pytest.raises(IngestError) as error:
        ingest(log, "llama.cpp", _prompts(tmp_path), tmp_path / "by-id")
    assert str(error.value) == (
        f"{log}:1: no prompt_id and no request id to join the prompt by (llama-server "
        '/completion responses carry none): wrap each as {"prompt_id": ..., "response": ...}, '
        "or use --join order, which is right only when the log's lines are in the prompts "
        "file's order (one client sending the prompts one at a time, in that order; the "
        "gateway logs in completion order)"
    )
    manifest = ingest(
        log,
        "llama.cpp",
        _prompts(tmp_path),
        tmp_path / "run",
        join="order",
        engine_version="0.3.36",
    )
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rows[
        ["prompt_id", "domain", "steps", "accepted", "drafted", "generated", "derived"]
    ].values.tolist() == [
        ["code-0", "code", 4, 11, 12, 16, "steps"],
        ["chat-0", "chat", 0, 0, 0, 1, ""],
    ]
    assert manifest["engine"] == "llama.cpp" and manifest["engine_version"] == "0.3.36"
    assert manifest["engine_version_from"] == "option" and manifest["join"] == "order"
    assert "logs no verify-step count" in manifest["derived"]["steps"]
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "run"), "--boot", "0"])
    assert result.exit_code == 0, result.output
    tables = (tmp_path / "run" / "analysis" / "tables.md").read_text()
    assert "Derived, not logged: steps = predicted" in tables  # beside the figure
    assert "logs no verify-step count" in tables
    analysis = json.loads((tmp_path / "run" / "analysis" / "analysis.json").read_text())
    code = {d["domain"]: d for d in analysis["domains"]}["code"]
    assert code["tokens_per_step"]["value"] == pytest.approx(15 / 4) and code["drafting"] == 1


def test_llamacpp_a_stop_inside_an_accepted_run_is_ingested(tmp_path):
    # server-context.cpp: slot.stats.n_draft_accepted += n_accepted, then process_token() per
    # accepted id; EOS at the first one ends the request: 2 tokens, 3 accepted drafts, 1 step.
    got = read_log(
        _write(
            tmp_path / "log.jsonl", [{"prompt_id": "a", "response": llama_completion(2, (3, 3))}]
        ),
        "llama.cpp",
    )
    assert [(s.steps, s.accepted, s.drafted, s.generated) for _, s in got] == [(1, 3, 3, 2)]


def test_llamacpp_chat_stream_reads_the_final_chunk_and_its_build(tmp_path):
    # server-task.cpp to_json_oaicompat_chat_stream: chunks "chat.completion.chunk"; the last
    # delta has the finish_reason and (line 517) "timings"; the server ends with data: [DONE].
    def chunk(finish=None, timings=None):
        c = {
            "choices": [{"finish_reason": finish, "index": 0, "delta": {"content": "x"}}],
            "created": 1764000000,
            "id": "chatcmpl-s1",
            "model": "qwen",
            "system_fingerprint": "b6912-0c1e5709",
            "object": "chat.completion.chunk",
        }
        return "data: " + json.dumps(c if timings is None else c | {"timings": timings})

    sse = [
        chunk(),
        "",
        chunk(),
        "",
        chunk("length", _llama_timings(3, (4, 2))),
        "",
        "data: [DONE]",
        "",
    ]
    prompts = _prompts(tmp_path, [{"id": "chatcmpl-s1", "domain": "chat", "prompt": "hi"}])
    manifest = ingest(_write(tmp_path / "log.sse", sse), "llama.cpp", prompts, tmp_path / "run")
    assert (
        manifest["engine_version"] == "b6912-0c1e5709" and manifest["engine_version_from"] == "log"
    )
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rows[["steps", "accepted", "drafted", "generated"]].values.tolist() == [[1, 2, 4, 3]]
    with pytest.raises(
        IngestError,
        match=r"engine version 'b6912-0c1e5709' differs from 'b7000' "
        r"\(--engine-version\)",
    ):
        ingest(
            tmp_path / "log.sse", "llama.cpp", prompts, tmp_path / "other", engine_version="b7000"
        )
    assert not (tmp_path / "other").exists()


# --- vLLM: docs/features/speculative_decoding/acceptance_metrics.md @02cf515f -----------------------
# (metrics.speculative_decoding, vLLM >= 0.29 with --per-request-spec-decode-metrics; the summary
# example below is the doc's own; streaming: only the final usage chunk carries metrics)

VLLM_SUMMARY = {
    "mean_acceptance_length": 1.2325581395348837,
    "draft_acceptance_rate": 0.07751937984496124,
    "acceptance_histogram": [39, 1, 0, 3],
    "acceptance_histogram_by_draft_length": {"3": [39, 1, 0, 3]},
    "num_spec_steps": 43,
    "num_accepted_draft_tokens": 10,
    "num_draft_tokens": 129,
    "num_spec_tokens": 3,
}


def vllm_chunks(rid="chatcmpl-7", n=1, final=True, metrics=VLLM_SUMMARY):
    """A chat stream with stream_options.include_usage: content chunks (usage null), then the
    usage chunk (choices []) with metrics."""
    out = [
        {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": i, "delta": {"content": "x"}, "finish_reason": None}],
            "usage": None,
        }
        for i in range(n)
        for _ in range(2)
    ]
    if final:
        out.append(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": 54, "total_tokens": 63},
                "metrics": {"speculative_decoding": metrics},
            }
        )
    return out


def test_vllm_sse_capture_and_chunk_per_line_give_the_summary_and_its_histogram(tmp_path):
    prompts = _prompts(tmp_path, [{"id": "chatcmpl-7", "domain": "code", "prompt": "q"}])
    sse = [line for c in vllm_chunks() for line in ("data: " + json.dumps(c), "")] + [
        "data: [DONE]"
    ]
    for name, lines in {"sse": sse, "chunks": vllm_chunks()}.items():
        ((_, stats),) = read_log(_write(tmp_path / f"{name}.log", lines), "vllm")
        assert (stats.steps, stats.accepted, stats.drafted, stats.generated) == (43, 10, 129, 54)
        assert stats.histogram == (39, 1, 0, 3)
    ingest(tmp_path / "sse.log", "vllm", prompts, tmp_path / "run", engine_version="0.29.1")
    hist = load_histogram(tmp_path / "run")
    assert hist[["accepted_len", "steps"]].values.tolist() == [[0, 39], [1, 1], [3, 3]]
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "run"), "--boot", "0"])
    assert result.exit_code == 0, result.output
    analysis = json.loads((tmp_path / "run" / "analysis" / "analysis.json").read_text())
    assert analysis["engine"] == "vLLM 0.29.1"
    assert analysis["step_distributions"]["code"] == {
        "steps": 43,
        "shares": pytest.approx([39 / 43, 1 / 43, 0.0, 3 / 43]),
    }


def test_vllm_n_above_1_is_named_unsupported_by_vllm(tmp_path):
    response = {
        "id": "cmpl-2",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {}}, {"index": 1, "message": {}}],
        "usage": {"completion_tokens": 20},
        "metrics": {"speculative_decoding": None},
    }
    for lines in ([response], vllm_chunks(n=2, metrics=None)):
        with pytest.raises(
            IngestError,
            match=r"request of 2 choices: vLLM reports it only for "
            r"n == 1 \(unsupported by vLLM for n > 1\)",
        ):
            read_log(_write(tmp_path / "log.jsonl", lines), "vllm")


def test_vllm_stream_without_its_usage_chunk_names_the_option(tmp_path):
    with pytest.raises(IngestError, match="ends without its final chunk.*include_usage"):
        read_log(_write(tmp_path / "log.jsonl", vllm_chunks(final=False)), "vllm")


def test_vllm_histogram_must_match_the_totals(tmp_path):
    bad = vllm_chunks(metrics=VLLM_SUMMARY | {"acceptance_histogram": [38, 1, 0, 3]})
    with pytest.raises(
        IngestError,
        match=r"acceptance_histogram sums to 42 steps, not "
        r"num_spec_steps \(43\)",
    ):
        read_log(_write(tmp_path / "log.jsonl", bad), "vllm")


# --- SGLang: python/sglang/srt/managers/tokenizer_manager.py `_calculate_spec_decoding_metrics` ---


def sglang(meta):
    return {
        "text": "x",
        "meta_info": {
            "id": "r1",
            "prompt_tokens": 9,
            "completion_tokens": 41,
            "finish_reason": {"type": "length"},
        }
        | meta,
    }


SGLANG_CASES = {
    # @001067ff: new names plus their backward-compatible aliases; 16 steps x 3 drafts proposed
    "001067ff": sglang(
        {
            "spec_verify_ct": 16,
            "spec_accept_rate": 23 / 48,
            "spec_accept_length": 41 / 16,
            "spec_num_correct_drafts": 23,
            "spec_num_proposed_drafts": 48,
            "spec_accepted_drafts": 23,
            "spec_proposed_drafts": 48,
            "spec_correct_drafts_histogram": [3, 6, 4, 3],
            "spec_accept_histogram": [3, 6, 4, 3],
        }
    ),
    # earlier (PR #18332 era): spec_accept_token_num, spec_draft_token_num, spec_accept_histogram
    "pr18332": sglang(
        {
            "spec_verify_ct": 16,
            "spec_accept_rate": 23 / 48,
            "spec_accept_length": 41 / 16,
            "spec_accept_token_num": 23,
            "spec_draft_token_num": 48,
            "spec_accept_histogram": [3, 6, 4, 3],
        }
    ),
}


def test_sglang_counts_are_read_under_every_name_they_had(tmp_path):
    # 23 accepted (the engine's count) while completion - 1 - steps = 24: a stop cut the last step
    for version, line in SGLANG_CASES.items():
        ((_, s),) = read_log(_write(tmp_path / "log.jsonl", [line]), "sglang")
        assert (s.steps, s.accepted, s.drafted, s.generated, s.histogram, s.derived) == (
            16,
            23,
            48,
            41,
            (3, 6, 4, 3),
            (),
        ), version


def test_sglang_derives_only_when_the_counts_are_absent_and_says_so(tmp_path):
    old = sglang({"spec_verify_ct": 16, "spec_accept_length": 2.5625})
    no_spec = sglang({"completion_tokens": 7}) | {"meta_info": {"id": "r2", "completion_tokens": 7}}
    log = _write(tmp_path / "log.jsonl", [old, no_spec])
    prompts = _prompts(
        tmp_path,
        [
            {"id": "r1", "domain": "code", "prompt": "a"},
            {"id": "r2", "domain": "chat", "prompt": "b"},
        ],
    )
    manifest = ingest(log, "sglang", prompts, tmp_path / "run")
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rows[["steps", "accepted", "derived"]].values.tolist() == [
        [16, 24, "accepted"],
        [0, 0, ""],
    ]
    assert pd.isna(rows["drafted"][0]) and rows["drafted"][1] == 0  # not logged; none drafted
    assert manifest["derived"] == {
        "accepted": "completion_tokens - 1 - spec_verify_ct (SGLang logged no accepted-draft count)"
    }


def test_sglang_histogram_must_give_the_accepted_count(tmp_path):
    line = SGLANG_CASES["pr18332"]
    line = line | {"meta_info": line["meta_info"] | {"spec_accept_histogram": [4, 5, 4, 3]}}
    with pytest.raises(
        IngestError,
        match=r"spec_accept_histogram gives 22 accepted drafts, not "
        r"spec_accept_token_num \(23\)",
    ):
        read_log(_write(tmp_path / "log.jsonl", [line]), "sglang")


# --- bad input: one line, nothing written ------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["-f", "vllm", "--engine-version", "0.28.0"],
            r"vLLM 0.28.0 has no per-request speculative metrics \(added in 0.29, PR #48915\); "
            "allowed: 0.29 or later",
        ),
        (
            ["-f", "vllm", "--engine-version", "latest"],
            "is not a vLLM version; allowed: MAJOR.MINOR",
        ),
        (
            ["-f", "llama.cpp", "--engine-version", "master"],
            "is not a llama.cpp build; allowed: bNNNN",
        ),
        (["-f", "vllm", "--join", "hash"], "unknown --join 'hash'; allowed: id, order"),
        (
            ["-f", "tgi"],
            "unknown format 'tgi'; allowed: vllm, sglang, llama.cpp, spec-bench, aiperf",
        ),
    ],
)
def test_unknown_versions_joins_and_formats_are_one_line_and_write_nothing(tmp_path, args, message):
    import re

    log = _write(tmp_path / "log.jsonl", vllm_chunks())
    result = CliRunner().invoke(
        app, ["ingest", str(log), "-p", str(_prompts(tmp_path)), "-o", str(tmp_path / "run"), *args]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(message, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "prompts.jsonl"]


def test_a_domain_that_never_drafted_shows_no_tokens_per_step_and_leaves_the_test():
    # the "none" domains specscope exports are served without drafting: llama-server omits
    # draft_n for all their requests
    from specscope.analysis.stepwise import analyze_ingested

    rows = [
        {"prompt_id": f"a{i}", "domain": "code", "steps": 10, "accepted": 15 + i % 3, "drafted": 30}
        for i in range(12)
    ]
    rows += [
        {"prompt_id": f"b{i}", "domain": "none", "steps": 0, "accepted": 0, "drafted": 0}
        for i in range(12)
    ]
    got = analyze_ingested({}, pd.DataFrame(rows), n_boot=50)
    none = {d.domain: d for d in got.domains}["none"]
    assert (none.prompts, none.drafting, none.steps) == (12, 0, 0)
    assert not none.tokens_per_step.defined
    assert (got.finding.verdict, got.finding.detail) == (
        "not testable",
        "1 of 2 domains drafted anything",
    )


# --- real llama-server responses -------------------------------------------------------------------
# Captured with tests/fixtures/llama_server/capture.py from llama-server built from the llama.cpp
# that llama-cpp-python 0.3.36 vendors (server.txt: build 1, commit 0c1e570), demo pair Q4_K_M,
# --spec-type draft-simple --spec-draft-n-max 3. The drafting replies: 16 tokens = the prefill's +
# 4 verify steps (3 + 3 + 3 drafts, then 2 as max_tokens nears: get_n_draft_max caps the draft at
# n_remaining - 1), all 11 accepted. The short replies (1 token) drafted nothing and carry no draft_n.

FIXTURES = Path(__file__).parents[1] / "fixtures" / "llama_server"


def _fixture(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_real_llama_server_responses_ingest_with_derived_steps(tmp_path):
    prompts = _prompts(
        tmp_path,
        [
            {"id": "fib", "domain": "code", "prompt": "def fibonacci(n):"},
            {"id": "paris", "domain": "chat", "prompt": "The capital"},
        ],
    )
    completion = _write(
        tmp_path / "completion.jsonl", [_fixture("completion_drafts"), _fixture("completion_short")]
    )
    manifest = ingest(completion, "llama.cpp", prompts, tmp_path / "completion", join="order")
    assert manifest["engine_version"] is None  # /completion states no build
    chat = _write(
        tmp_path / "chat.jsonl",
        [
            {"prompt_id": "fib", "response": _fixture("chat_drafts")},
            {"prompt_id": "paris", "response": _fixture("chat_short")},
        ],
    )
    manifest = ingest(chat, "llama.cpp", prompts, tmp_path / "chat")
    assert manifest["engine_version"] == "b1-0c1e570" and manifest["engine_version_from"] == "log"
    for run in ("completion", "chat"):
        rows = pd.read_parquet(tmp_path / run / "requests.parquet")
        assert rows[
            ["prompt_id", "steps", "accepted", "drafted", "generated", "derived"]
        ].values.tolist() == [["fib", 4, 11, 11, 16, "steps"], ["paris", 0, 0, 0, 1, ""]], run
        assert rows["tokens_per_step"][0] == 15 / 4


def test_a_real_llama_server_sse_capture_reads_its_final_chunk(tmp_path):
    # chat_stream.sse: 8 tokens = the prefill's + 2 verify steps (3 drafts, then 2), 5 accepted
    stream = FIXTURES / "chat_stream.sse"
    request_id = json.loads(stream.read_text().split("\n", 1)[0][len("data: ") :])["id"]
    prompts = _prompts(tmp_path, [{"id": request_id, "domain": "code", "prompt": "sum"}])
    manifest = ingest(stream, "llama.cpp", prompts, tmp_path / "run")
    assert manifest["engine_version"] == "b1-0c1e570"
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rows[["steps", "accepted", "drafted", "generated"]].values.tolist() == [[2, 5, 5, 8]]


# --- AIPerf: profile_export.jsonl -------------------------------------------------------------------
# ai-dynamo/aiperf src/aiperf/common/models/record_models.py@1849cd1b: one MetricRecordInfo per line,
# {metadata: MetricRecordMetadata, metrics: {tag: {value, unit}}, spec_decode_acceptance, error};
# spec_decode_models.py@0786f0ca: SpecDecodeAcceptanceRecord (acceptance_histogram sparse, string
# keys on the wire); metrics/types/spec_decode_metrics.py@1849cd1b: the spec_decode_* record metrics
# (steps: unit count; accepted/draft tokens: unit tokens); no record for a zero-step request.
# The values are written here, worked by hand.


def aiperf_line(conversation="code-0", turn=0, acceptance=None, error=None, session=0):
    metrics = {
        "request_latency": {"value": 412.5, "unit": "ms"},
        "output_sequence_length": {"value": 11, "unit": "tokens"},
    }
    if acceptance is not None:
        steps = acceptance["num_spec_steps"]
        accepted = acceptance["num_accepted_draft_tokens"]
        drafted = acceptance["num_draft_tokens"]
        metrics |= {
            "spec_decode_acceptance_length": {"value": 1 + accepted / steps, "unit": "ratio"},
            "spec_decode_draft_acceptance_rate": {"value": 100 * accepted / drafted, "unit": "%"},
            "spec_decode_accepted_per_verified": {
                "value": (accepted + steps) / (drafted + steps),
                "unit": "ratio",
            },
            "spec_decode_steps": {"value": steps, "unit": "count"},
            "spec_decode_accepted_draft_tokens": {"value": accepted, "unit": "tokens"},
            "spec_decode_draft_tokens": {"value": drafted, "unit": "tokens"},
        }
    line = {
        "metadata": {
            "session_num": session,
            "x_request_id": f"5f0c1a2e-0000-4000-8000-00000000000{session}",
            "x_correlation_id": f"9a1b2c3d-0000-4000-8000-00000000000{session}",
            "conversation_id": conversation,
            "turn_index": turn,
            "request_start_ns": 1_760_000_000_000_000_000 + session,
            "request_ack_ns": 1_760_000_000_010_000_000 + session,
            "request_end_ns": 1_760_000_000_412_500_000 + session,
            "worker_id": "worker_0",
            "record_processor_id": "record_processor_0",
            "benchmark_phase": "profiling",
            "was_cancelled": False,
            "agent_depth": 0,
        },
        "metrics": metrics if error is None else {},
    }
    if acceptance is not None:
        line["spec_decode_acceptance"] = acceptance
    if error is not None:
        line["error"] = error
    return line


def aiperf_vllm(per_step_accepted, k=3, completion_tokens=None):
    """vllm_adapter.py@7bb5f5c8: vLLM's dense histogram made sparse (zero buckets dropped), the
    per-step lists of its detailed metrics copied."""
    steps, accepted = len(per_step_accepted), sum(per_step_accepted)
    histogram = {}
    for a in per_step_accepted:
        histogram[str(a)] = histogram.get(str(a), 0) + 1
    return {
        "engine": "vllm",
        "mean_acceptance_length": 1 + accepted / steps,
        "draft_acceptance_rate": accepted / (k * steps),
        "acceptance_histogram": dict(sorted(histogram.items())),
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": k * steps,
        "num_spec_steps": steps,
        "num_spec_tokens": k,
        "completion_tokens": completion_tokens,
        "per_step_accepted": per_step_accepted,
        "per_step_drafted": [k] * steps,
    }


def _aiperf_prompts(tmp_path):
    return _prompts(
        tmp_path,
        [
            {"id": f"{d}-{i}", "domain": d, "prompt": f"{d} question {i}"}
            for d in ("code", "chat")
            for i in range(3)
        ]
        + [{"id": "chat-0:1", "domain": "chat", "prompt": "and a follow-up"}],
    )


def _ingest_aiperf(tmp_path, lines, *extra):
    log = _write(tmp_path / "profile_export.jsonl", lines)
    out = tmp_path / "run"
    args = ["ingest", str(log), "--format", "aiperf", "-p", str(_aiperf_prompts(tmp_path))]
    return CliRunner().invoke(app, [*args, "-o", str(out), *extra]), out


def test_aiperf_profile_export_ingests_through_the_cli_into_a_run_that_analyze_reads(tmp_path):
    lines = [  # code accepts 2 drafts a step (3 tokens), chat 1 (2 tokens)
        aiperf_line(f"code-{i}", acceptance=aiperf_vllm([2, 3, 1, 2], completion_tokens=13))
        for i in range(3)
    ] + [
        aiperf_line(f"chat-{i}", acceptance=aiperf_vllm([1, 0, 2, 1], completion_tokens=9))
        for i in range(3)
    ]
    lines += [
        aiperf_line("chat-0", turn=1, acceptance=aiperf_vllm([1, 1], completion_tokens=5)),
        aiperf_line("code-9"),  # no verify step: AIPerf writes no record, nor the metrics
        aiperf_line("code-8", error={"code": 500, "type": "HTTPError", "message": "boom"}),
    ]
    result, out = _ingest_aiperf(tmp_path, lines)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"] == "AIPerf" and manifest["counts"]["requests"] == 7
    assert manifest["derived"] == {} and manifest["per_step"] and manifest["histogram"]
    assert manifest["skipped"]["without_statistics"] == 2
    assert "without spec_decode_acceptance" in manifest["warnings"][0]
    assert "ran no verify step" in manifest["warnings"][0]
    requests = pd.read_parquet(out / "requests.parquet").set_index("prompt_id")
    assert requests.loc["code-0", ["steps", "accepted", "drafted", "generated"]].tolist() == [
        4,
        8,
        12,
        13,
    ]
    assert requests.loc["chat-0:1", "steps"] == 2  # a later turn joins CONVERSATION:TURN
    code0 = load_histogram(out).query("prompt_id == 'code-0'")
    assert dict(zip(code0["accepted_len"], code0["steps"])) == {1: 1, 2: 2, 3: 1}
    result = CliRunner().invoke(app, ["analyze", str(out), "--boot", "0"])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "analysis" / "analysis.json").read_text())
    rows = {d["domain"]: d for d in analysis["domains"]}
    assert rows["code"]["tokens_per_step"]["value"] == pytest.approx(3.0)
    assert rows["chat"]["tokens_per_step"]["value"] == pytest.approx(2.0)  # (14 + 14) / 14


def test_aiperf_trtllm_histogram_is_read_and_llamacpp_steps_are_derived(tmp_path):
    trtllm = {  # trtllm_adapter.py@038b7df1: no per-step lists; the engine's dense histogram
        "engine": "tensorrt_llm",
        "mean_acceptance_length": 2.0,
        "draft_acceptance_rate": 0.5,
        "acceptance_histogram": {"0": 1, "1": 1, "2": 2},
        "num_accepted_draft_tokens": 5,
        "num_draft_tokens": 10,
        "num_spec_steps": 4,
        "num_spec_tokens": 2,
        "completion_tokens": 10,
    }
    # llamacpp_adapter.py@5850dd43: predicted_n 16, draft_n 12, draft_n_accepted 11 become
    # num_spec_steps = 16 - 11 = 5 and an even histogram {2: 4, 3: 1}; completion_tokens null
    llamacpp = {
        "engine": "llamacpp",
        "mean_acceptance_length": 1 + 11 / 5,
        "draft_acceptance_rate": 11 / 12,
        "acceptance_histogram": {"3": 1, "2": 4},
        "num_accepted_draft_tokens": 11,
        "num_draft_tokens": 12,
        "num_spec_steps": 5,
        "num_spec_tokens": None,
        "completion_tokens": None,
    }
    log = _write(
        tmp_path / "log.jsonl",
        [aiperf_line("code-0", acceptance=trtllm), aiperf_line("code-1", acceptance=llamacpp)],
    )
    (_, trt), (_, llama) = read_log(log, "aiperf")
    assert (trt.steps, trt.accepted, trt.drafted, trt.generated) == (4, 5, 10, 10)
    assert trt.histogram == (1, 1, 2) and trt.derived == ()
    # specscope's llama.cpp derivation: 16 - 1 - 11 = 4 verify steps; AIPerf's histogram dropped
    assert (llama.steps, llama.accepted, llama.drafted, llama.generated) == (4, 11, 12, 16)
    assert llama.histogram is None and llama.derived == ("generated", "steps")
    result, out = _ingest_aiperf(
        tmp_path, [aiperf_line("code-1", acceptance=llamacpp)], "--join", "id"
    )
    assert result.exit_code == 0, result.output
    derived = json.loads((out / "manifest.json").read_text())["derived"]
    assert set(derived) == {"generated", "steps"} and "predicted_n" in derived["generated"]


@pytest.mark.parametrize(
    "change,message",
    [
        (
            lambda a: a.update(num_spec_steps="4"),
            r"spec_decode_acceptance\.num_spec_steps must be an integer, got '4'",
        ),
        (
            lambda a: a.pop("num_draft_tokens"),
            r"spec_decode_acceptance\.num_draft_tokens is missing; give an integer",
        ),
        (
            lambda a: a.update(acceptance_histogram={"one": 4}),
            r"spec_decode_acceptance: acceptance_histogram has a key 'one'",
        ),
        (
            lambda a: a.update(acceptance_histogram={"0": 1, "1": 1, "2": 1, "4": 1}),
            r"acceptance_histogram has a bucket 4 above num_spec_tokens \(3\)",
        ),
        (
            lambda a: a.update(acceptance_histogram={"2": 3, "1": 2}),
            r"acceptance_histogram sums to 5 steps, not num_spec_steps \(4\)",
        ),
        (
            lambda a: a.update(per_step_drafted=None),
            r"per_step_drafted is missing; AIPerf copies per_step_accepted and per_step_drafted",
        ),
        (
            lambda a: a.update(completion_tokens=5),
            r"num_accepted_draft_tokens \+ num_spec_steps \(8 \+ 4\) exceeds completion_tokens",
        ),
    ],
)
def test_aiperf_bad_records_are_refused_in_one_line_naming_the_field(tmp_path, change, message):
    import re

    line = aiperf_line("code-0", acceptance=aiperf_vllm([2, 3, 1, 2], completion_tokens=13))
    change(line["spec_decode_acceptance"])
    result, out = _ingest_aiperf(tmp_path, [line])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(message, lines[0])
    assert "profile_export.jsonl:1: " in lines[0] and not out.exists()


def test_aiperf_metrics_that_disagree_with_the_record_and_a_missing_metadata_are_refused(tmp_path):
    line = aiperf_line("code-0", acceptance=aiperf_vllm([2, 3, 1, 2]))
    line["metrics"]["spec_decode_steps"]["value"] = 5
    with pytest.raises(IngestError, match=r"metrics\.spec_decode_steps\.value \(5\) differs"):
        read_log(_write(tmp_path / "a.jsonl", [line]), "aiperf")
    line = aiperf_line("code-0", acceptance=aiperf_vllm([2, 3, 1, 2]))
    del line["metadata"]
    with pytest.raises(IngestError, match=r"a\.jsonl:1: metadata is missing; give a table"):
        read_log(_write(tmp_path / "a.jsonl", [line]), "aiperf")
    only_errors = [aiperf_line("code-8", error={"code": 500, "message": "boom"})]
    with pytest.raises(IngestError, match="holds no requests: 1 line.* without spec_decode_acc"):
        read_log(_write(tmp_path / "a.jsonl", only_errors), "aiperf")
