"""specscope gateway: routing by domain, answers passed through unchanged (streams chunk by
chunk, engine errors), a backend that is down, and a log that specscope ingest reads.

The backends here are small HTTP servers that answer in llama-server's shapes (the vendored
llama.cpp @0c1e570: ``server_slot_stats::to_json`` in tools/server/server-common.cpp writes
``draft_n``/``draft_n_accepted`` only when something was drafted; a streamed chat answer carries
``timings`` in its last chunk, ``server-task.cpp``). The real llama-server is in
tests/serving/test_gateway_llamaserver.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from typer.testing import CliRunner

from specscope.cli import app
from specscope.serving.gateway import (
    Backend,
    Deployment,
    DeploymentError,
    SseScanner,
    errors_path,
    make_app,
    request_text,
)
from specscope.serving.ingest import ingest

CODE = "Write a python function that returns the sum of a list."
MATH = "Find all real numbers x such that x^2 - 5x + 6 = 0."
CHAT = "Describe a quiet morning in a small harbour town."

# timings as llama-server writes them (draft_n only where something was drafted)
DRAFTED = {
    "cache_n": 0,
    "prompt_n": 12,
    "prompt_ms": 30.0,
    "predicted_n": 10,
    "predicted_ms": 200.0,
    "draft_n": 9,
    "draft_n_accepted": 6,
}
PLAIN = {"cache_n": 0, "prompt_n": 12, "prompt_ms": 30.0, "predicted_n": 10, "predicted_ms": 300.0}
ENGINE_ERROR = {
    "error": {
        "code": 400,
        "message": "'messages' must be an array",
        "type": "invalid_request_error",
    }
}


class Served:
    """An ASGI app served by uvicorn on a free local port, in a thread."""

    def __init__(self, asgi):
        self.server = uvicorn.Server(
            uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="error")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def fake_llama_server(name: str) -> Starlette:
    """Answers /v1/chat/completions and /completion as llama-server does; the ``model`` and
    route it was asked for are echoed so that a test sees where a request landed."""

    async def chat(request: Request):
        body = await request.json()
        if not isinstance(body.get("messages"), list):
            return JSONResponse(ENGINE_ERROR, status_code=400)
        timings = DRAFTED if body.get("model") in ("code", "math") else PLAIN
        if body.get("stream"):

            async def events():
                for word in ("def", " f", "(x)"):
                    chunk = {
                        "choices": [{"delta": {"content": word}, "index": 0}],
                        "model": body.get("model"),
                        "object": "chat.completion.chunk",
                    }
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                    await asyncio.sleep(0.3)
                final = {
                    "choices": [{"delta": {}, "finish_reason": "length", "index": 0}],
                    "model": body.get("model"),
                    "object": "chat.completion.chunk",
                    "timings": timings,
                }
                yield f"data: {json.dumps(final)}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "server": name,
                "model": body.get("model"),
                "path": request.url.path,
                "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                "timings": timings,
            }
        )

    async def completion(request: Request):
        body = await request.json()
        return JSONResponse(
            {
                "content": "ok",
                "id_slot": 0,
                "model": body.get("model"),
                "server": name,
                "path": request.url.path,
                "timings": DRAFTED,
            }
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/completion", completion, methods=["POST"]),
        ]
    )


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more


@pytest.fixture()
def setup(tmp_path):
    engine = Served(fake_llama_server("router"))
    down = closed_port_url()
    deployment = Deployment(
        "llama.cpp",
        {
            "code": Backend(engine.url, "code"),
            "math": Backend(engine.url, "math"),
            "reasoning": Backend(down, "reasoning"),
        },
        Backend(engine.url, "plain"),
    )
    log = tmp_path / "gateway.jsonl"
    gateway = Served(make_app(deployment, log))
    yield gateway.url, log, down
    gateway.stop()
    engine.stop()


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def chat(url, text, prompt_id=None, **extra):
    headers = {"X-Prompt-Id": prompt_id} if prompt_id else {}
    return httpx.post(
        url + "/v1/chat/completions",
        headers=headers,
        timeout=30,
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra},
    )


def test_requests_reach_their_domains_preset_and_the_log_ingests(setup, tmp_path):
    url, log, _ = setup
    answers = {
        pid: chat(url, text, pid) for pid, text in (("c1", CODE), ("m1", MATH), ("h1", CHAT))
    }
    assert {
        pid: (a.status_code, a.json()["model"], a.headers["x-specscope-domain"])
        for pid, a in answers.items()
    } == {"c1": (200, "code", "code"), "m1": (200, "math", "math"), "h1": (200, "plain", "chat")}
    completion = httpx.post(
        url + "/completion",
        json={"prompt": CODE, "n_predict": 8},
        headers={"X-Prompt-Id": "c2"},
        timeout=30,
    )
    assert (completion.json()["model"], completion.json()["path"]) == ("code", "/completion")
    lines = read_lines(log)
    assert [(x["prompt_id"], x["domain"], x["model"], x["path"]) for x in lines] == [
        ("c1", "code", "code", "/v1/chat/completions"),
        ("m1", "math", "math", "/v1/chat/completions"),
        ("h1", "chat", "plain", "/v1/chat/completions"),
        ("c2", "code", "code", "/completion"),
    ]
    assert lines[0]["response"] == answers["c1"].json()  # the engine's answer, as it came

    # ingest joins each line by its prompt_id (a request of the plain preset: nothing drafted)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": i, "domain": d, "prompt": t}) + "\n"
            for i, d, t in (
                ("c1", "code", CODE),
                ("m1", "math", MATH),
                ("h1", "chat", CHAT),
                ("c2", "code", CODE),
            )
        )
    )
    manifest = ingest(log, "llama.cpp", prompts, tmp_path / "run")
    assert manifest["counts"]["requests"] == 4
    assert manifest["counts"]["domains"] == ["chat", "code", "math"]
    import pandas as pd

    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet").set_index("prompt_id")
    # predicted_n 10, 6 accepted: 10 - 1 - 6 = 3 verify steps, (6 + 3) / 3 tokens per step
    assert requests.loc[["c1", "m1", "c2"], "tokens_per_step"].tolist() == [3.0, 3.0, 3.0]
    assert requests.loc["h1", "accepted"] == 0 and requests.loc["h1", "drafted"] == 0


def test_a_stream_passes_through_chunk_by_chunk_and_its_last_stats_are_logged(setup):
    url, log, _ = setup
    start, arrivals, received = time.monotonic(), [], b""
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        headers={"X-Prompt-Id": "s1"},
        json={"messages": [{"role": "user", "content": CODE}], "stream": True},
        timeout=30,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        for chunk in answer.iter_raw():
            arrivals.append(time.monotonic() - start)
            received += chunk
    events = [e for e in received.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) == 5
    # the first event reached the client while the engine was still generating: the engine
    # paces its 4 events 0.3 s apart, so a buffered relay would deliver them all at once (the
    # spread between arrivals, not their absolute times, so that a busy machine does not matter)
    assert len(arrivals) > 1 and arrivals[-1] - arrivals[0] > 0.5
    (line,) = read_lines(log)
    assert line["stream"] is True and line["prompt_id"] == "s1" and line["domain"] == "code"
    assert line["response"]["timings"] == DRAFTED


def test_an_engine_error_comes_back_unchanged_and_is_logged_apart(setup):
    url, log, _ = setup
    answer = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "x", "prompt": CODE},
        headers={"X-Prompt-Id": "bad"},
        timeout=30,
    )
    assert answer.status_code == 400 and answer.json() == ENGINE_ERROR
    assert read_lines(log) == []
    (line,) = read_lines(errors_path(log))
    assert (line["prompt_id"], line["status"], json.loads(line["body"])) == (
        "bad",
        400,
        ENGINE_ERROR,
    )


def test_a_backend_that_is_down_gets_a_502_naming_it_and_the_others_keep_serving(setup):
    url, log, down = setup
    answer = chat(
        url, "How many apples are left if Tom buys 3 and eats 2? Give the final answer.", "r1"
    )
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert (error["type"], error["domain"], error["backend"]) == (
        "backend_unavailable",
        "reasoning",
        down,
    )
    assert down in error["message"] and "'reasoning'" in error["message"]
    assert chat(url, CODE, "c1").status_code == 200
    assert [x["prompt_id"] for x in read_lines(log)] == ["c1"]
    assert [(x["prompt_id"], x["status"]) for x in read_lines(errors_path(log))] == [("r1", 502)]


def test_a_body_that_is_not_a_json_object_is_refused_by_the_gateway(setup):
    url, _, _ = setup
    answer = httpx.post(url + "/v1/chat/completions", content=b"[1, 2]", timeout=30)
    assert answer.status_code == 400 and "JSON object" in answer.json()["error"]["message"]


def test_request_text_reads_chat_turns_and_completion_prompts():
    assert (
        request_text(
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"},
                ]
            }
        )
        == "a\n\nc"
    )
    assert request_text({"prompt": ["x", "y"]}) == "x\n\ny"
    assert request_text({"prompt": [1, 2, 3]}) == ""  # token ids: the fallback's


def test_sse_scanner_keeps_an_incomplete_line_for_the_next_chunk():
    scanner = SseScanner()
    assert scanner.feed(b'data: {"a": 1}\r\n\r\ndata: [DONE]\n\ndata: {"b"') == [{"a": 1}]
    assert scanner.done and bytes(scanner._line) == b'data: {"b"'
    assert scanner.feed(b": 2}\n") == [{"b": 2}] and scanner._line == b""


DEPLOYMENT = """
engine = "llama.cpp"
[fallback]
url = "http://127.0.0.1:8080/"
model = "plain"
[domains.code]
url = "http://127.0.0.1:8080"
model = "code"
"""


def test_a_deployment_file_loads():
    plan = Deployment.from_table(__import__("tomllib").loads(DEPLOYMENT))
    assert plan.domains == {"code": Backend("http://127.0.0.1:8080", "code")}
    assert plan.fallback == Backend("http://127.0.0.1:8080", "plain")
    assert plan.route(CODE)[1].model == "code" and plan.route(CHAT)[1].model == "plain"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            DEPLOYMENT + '[domains.legal]\nurl = "http://h:1"\n',
            (
                "domain 'legal': specscope's router never routes to it (it produces code, math, "
                "reasoning, chat)"
            ),
        ),
        ('[domains.code]\nurl = "http://h:1"\n', "fallback is missing; give a table (an object)"),
        ('engine = "llama.cpp"\nfallback = "http://h:1"\n', "fallback must be a table (an object)"),
        (
            DEPLOYMENT + "[domains.math]\nurl = 8080\n",
            "domains.math.url must be a string, got 8080",
        ),
        (
            DEPLOYMENT.replace('url = "http://127.0.0.1:8080/"', 'url = "127.0.0.1:8080"'),
            "fallback: url must be an http:// or https:// base URL with a host, got '127.0.0.1:8080'",
        ),
        (
            DEPLOYMENT.replace('"llama.cpp"', '"tgi"'),
            "engine 'tgi' is not one the gateway logs for",
        ),
        (DEPLOYMENT + "port = 3\n", "unknown key 'domains.code.port'; allowed: model, url"),
        (
            "port = 3\n" + DEPLOYMENT,
            "unknown key 'port'; allowed: domains, engine, fallback, vllm_compatible_metrics",
        ),
    ],
)
def test_bad_deployments_are_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "deployment.toml"
    path.write_text(text)
    with pytest.raises(DeploymentError, match=None) as e:
        Deployment.load(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    result = CliRunner().invoke(app, ["gateway", str(path), "--log", str(tmp_path / "g.jsonl")])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "g.jsonl").exists()


def test_an_export_document_deploys_with_its_own_routing_rule(tmp_path):
    from specscope.serving.export import export_policy
    from specscope.serving.export_plan import ExportOptions
    from specscope.serving.llamacpp.study import chain
    from specscope.tune.policy import PolicyFile

    policy = PolicyFile({"code": chain(3), "math": None, "reasoning": None, "chat": None})
    document = export_policy(policy, "llama.cpp", ExportOptions(draft="d.gguf", target="t.gguf"))
    path = tmp_path / "export.json"
    path.write_text(json.dumps(document))
    plan = Deployment.load(path, {"*": "http://127.0.0.1:8080"})
    assert {d: b.model for d, b in plan.domains.items()} == {
        "code": "code",
        "math": "math",
        "reasoning": "reasoning",
        "chat": "chat",
    }
    assert plan.fallback == Backend("http://127.0.0.1:8080", "chat")
    assert plan.route(CODE)[0] == "code"
    document["routing"]["threshold"] = 99.0  # no rule reaches it: every prompt is the fallback's
    path.write_text(json.dumps(document))
    assert Deployment.load(path, {"*": "http://h:1"}).route(CODE)[0] == "chat"
    with pytest.raises(DeploymentError, match="no backend URL for domain 'code'"):
        Deployment.load(path, {"math": "http://h:1"})
    result = CliRunner().invoke(app, ["gateway", str(path), "--log", str(tmp_path / "g.jsonl")])
    assert result.exit_code == 2 and "--url code=URL" in result.output
