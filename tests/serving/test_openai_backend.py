"""The bench's backends: held-out prompts refused by every one, the OpenAI-compatible backend's
reading of vLLM's, SGLang's and llama-server's answers and of vLLM's Prometheus counters, and
(llamacpp mark) its counts against a real llama-server's own."""

import json

import pytest

from specscope.prompts.items import PromptItem
from specscope.serving.llamacpp.backend import LlamaServerBackend
from specscope.serving.llamacpp.server import ServerSetting
from specscope.serving.openai_server import (
    OpenAIBackend,
    ServerURL,
    answer_counts,
    decoded_answer,
    prometheus_counts,
)
from specscope.tune.backends import (
    PLAIN,
    DecoderSetting,
    Engines,
    Prompt,
    SpecscopeBackend,
    TransformersBackend,
    TransformersSetting,
)
from specscope.tune.bench import BenchError, HeldOut, Loop, TuningPrompts, run_bench


def _prompt(i=0):
    return Prompt(
        PromptItem(f"p{i}", "code", ({"role": "user", "content": "def f():"},)), (1, 2), "x"
    )


def _never(*_):
    raise AssertionError("a backend was started for a bench that is refused")


@pytest.mark.parametrize(
    "backend, settings",
    [
        (
            Engines(
                {
                    TransformersSetting: TransformersBackend(None, None, frozenset(), 4),
                    DecoderSetting: SpecscopeBackend(_never, None),
                }
            ),  # fmt: skip
            {"plain": PLAIN},
        ),
        (LlamaServerBackend(None, None, None, 4, serve=_never), {"plain": ServerSetting()}),
        (OpenAIBackend(4, _never), {"plain": ServerURL("http://127.0.0.1:9")}),
    ],
    ids=["specscope", "llama-server", "openai"],
)
def test_every_backend_refuses_a_tuning_prompt_unless_labelled_in_sample(backend, settings):
    tuned = TuningPrompts(frozenset({"p0"}), ("r1",), known=True)
    with pytest.raises(BenchError, match="measured by the policy's tuning runs"):
        run_bench(backend, [_prompt(1), _prompt(0)], settings, Loop(1, 0, HeldOut(tuned)))


# --- answers and counters ------------------------------------------------------------------------


def test_a_vllm_answer_gives_its_per_request_counts():
    """vLLM >= 0.29 with --per-request-spec-decode-metrics (docs/features/speculative_decoding/
    acceptance_metrics.md @02cf515f, the doc's own summary example)."""
    answer = {
        "choices": [{"index": 0, "text": "abc", "token_ids": [5, 6, 7], "finish_reason": "length"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 54, "total_tokens": 63},
        "metrics": {"speculative_decoding": {"num_spec_steps": 43, "num_accepted_draft_tokens": 10,
                                             "num_draft_tokens": 129, "num_spec_tokens": 3,
                                             "acceptance_histogram": [39, 1, 0, 3]}},
    }  # fmt: skip
    counts = answer_counts(answer)
    assert (counts.drafted, counts.accepted) == (129, 10) and "metrics" in counts.source
    d = decoded_answer(answer, counts, 2.0, _never)
    assert d.output_ids == (5, 6, 7) and d.steps == 54 - 10 and d.time_s == 2.0
    assert d.first_token_s == 0.0 and d.stop_type == "length"


def test_an_sglang_answer_gives_its_per_request_counts():
    """SGLang's meta_info (python/sglang/srt/managers/tokenizer_manager.py @001067ff)."""
    answer = {
        "text": "x",
        "meta_info": {"id": "r1", "prompt_tokens": 9, "completion_tokens": 41,
                      "spec_verify_ct": 16, "spec_num_correct_drafts": 23,
                      "spec_num_proposed_drafts": 48, "finish_reason": {"type": "length"}},
    }  # fmt: skip
    counts = answer_counts(answer)
    assert (counts.drafted, counts.accepted) == (48, 23)


def test_a_llama_server_answer_gives_its_counts_and_its_own_times():
    """A /v1/completions answer of llama-server (llama-cpp-python 0.3.36's build): timings with
    draft_n and draft_n_accepted, and none where nothing was drafted."""
    answer = {
        "choices": [{"text": "    if n <= 0:\n       ", "index": 0, "finish_reason": "length"}],
        "usage": {"completion_tokens": 8, "prompt_tokens": 4, "total_tokens": 12},
        "timings": {"prompt_n": 4, "prompt_ms": 251.159, "predicted_n": 8,
                    "predicted_ms": 955.494, "draft_n": 4, "draft_n_accepted": 4},
    }  # fmt: skip
    counts = answer_counts(answer)
    assert (counts.drafted, counts.accepted) == (4, 4)
    d = decoded_answer(answer, counts, 9.9, lambda text: [1] * 8)
    assert d.steps == 8 - 4 and d.first_token_s == pytest.approx(0.251159)
    assert d.time_s == pytest.approx(0.251159 + 0.955494)
    plain = {**answer, "timings": {"prompt_ms": 1.0, "predicted_ms": 2.0, "predicted_n": 8}}
    assert (answer_counts(plain).drafted, answer_counts(plain).accepted) == (0, 0)
    assert answer_counts({"choices": []}) is None


def test_vllms_prometheus_counters_are_summed_over_their_labels():
    """vllm:spec_decode_num_draft_tokens and vllm:spec_decode_num_accepted_tokens
    (vllm/v1/spec_decode/metrics.py @016a8587), one series per engine."""
    text = "\n".join([
        "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 9.0',
        "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 10.0',
        "# HELP vllm:num_requests_running Running.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{model_name="m"} 0.0',
        "",
    ])  # fmt: skip
    assert prometheus_counts(text) == (129.0, 10.0)
    assert prometheus_counts("# TYPE other counter\nother_total 1.0\n") is None


def test_a_url_is_named_or_called_server():
    assert ServerURL.parse("plain=http://h:8001/") == ("plain", ServerURL("http://h:8001"))
    assert ServerURL.parse("http://h:8000", chat=True) == (
        "server",
        ServerURL("http://h:8000", chat=True),
    )


def test_a_request_is_sent_greedy_with_the_prompts_ids_or_its_messages():
    backend = OpenAIBackend(16, _never)
    body = backend.body(ServerURL("http://h", model="m"), _prompt())
    assert body["prompt"] == [1, 2] and body["max_tokens"] == 16 and body["temperature"] == 0
    assert body["model"] == "m" and not body["stream"]
    chat = backend.body(ServerURL("http://h", chat=True), _prompt())
    assert chat["messages"] == [{"role": "user", "content": "def f():"}] and "prompt" not in chat


# --- against a real llama-server -----------------------------------------------------------------


@pytest.mark.weights
@pytest.mark.llamacpp
def test_the_openai_backend_counts_what_llama_server_counts(tmp_path):
    """llama-server with the demo draft GGUF as its own draft (K = 2): per request, the drafted
    and accepted counts and the steps the OpenAI-compatible backend reads from /v1/completions
    are llama-server's own (its /completion answer to the same greedy request)."""
    from test_llamaserver import _demo_or_skip

    from specscope.serving.llamacpp.backend import decoded
    from specscope.serving.llamacpp.server import LlamaServer

    tools, gguf = _demo_or_skip()
    setting = ServerSetting(threads=1, poll=0, k=2, draft_poll=0)
    with LlamaServer(tools, gguf, setting, draft=gguf) as server:
        texts = ['def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
                 "The capital of France is"]  # fmt: skip
        prompts = [
            Prompt(PromptItem(f"p{i}", "code", ()), tuple(server.tokenize(t)), t)
            for i, t in enumerate(texts)
        ]
        backend = OpenAIBackend(12, server.tokenize)
        timed = run_bench(backend, prompts, {"plain": ServerURL(server.url)}, Loop(1))
        for request, prompt in zip(timed.requests, prompts):
            own = decoded(server.complete(list(prompt.ids), 12))
            assert own.drafted > 0
            assert (request.drafted, request.accepted, request.steps) == (
                own.drafted, own.accepted, own.steps,
            )  # fmt: skip
            assert len(own.output_ids) == 12
    json.dumps([r.to_dict() for r in timed.requests])  # a checkpoint line holds them
