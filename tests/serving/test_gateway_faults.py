"""specscope gateway left running: isolated backends, bounded inputs, logs that keep everything.

Each test stands the real gateway (uvicorn on 127.0.0.1) in front of :class:`FakeBackend`, a raw
asyncio HTTP server shaped like llama-server whose ``X-Fake-Mode`` header (forwarded by the
gateway like any client header) picks a misbehaviour: hang, a body shorter than its
Content-Length, JSON nested 100k deep, a lone surrogate, an endless SSE line, a stream without
statistics, an answer over the size limit. The last tests run ``specscope gateway`` as a
process and stop it with SIGTERM and SIGKILL.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from typer.testing import CliRunner

import specscope.serving.gateway as gw
import specscope.serving.gateway.logs as gateway_logs
from specscope.cli import app
from specscope.serving.gateway import (
    STOPPED,
    Backend,
    Deployment,
    DeploymentError,
    GatewayError,
    GatewayLimits,
    RequestLog,
    SseScanner,
    errors_path,
    listen,
    make_app,
    open_logs,
)
from specscope.serving.gateway.metrics import Prediction
from specscope.serving.gateway.proxy import AcceptFailureLog, gateway_server, run_server
from specscope.serving.ingest import ingest
from specscope.tune.router import RuleRouter

CODE = "Write a python function that returns the sum of a list."
CHAT = "Describe a quiet morning in a small harbour town."
TIMINGS = {
    "cache_n": 0,
    "prompt_n": 12,
    "prompt_ms": 30.0,
    "predicted_n": 10,
    "predicted_ms": 200.0,
    "draft_n": 9,
    "draft_n_accepted": 6,
}


def answer_json(extra: dict | None = None) -> bytes:
    body = {"choices": [{"message": {"role": "assistant", "content": "ok"}}], "timings": TIMINGS}
    return json.dumps({**body, **(extra or {})}).encode()


def sse(*events: dict | str) -> bytes:
    return b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


CHUNK = {"choices": [{"delta": {"content": "x"}, "index": 0}], "object": "chat.completion.chunk"}
FINAL = {"choices": [{"delta": {}, "finish_reason": "length", "index": 0}], "timings": TIMINGS}


class FakeBackend:
    """A raw asyncio HTTP/1.1 server on 127.0.0.1, one request per connection. It keeps each
    request's path, headers and body (``seen``) and counts the connections open (``open``)."""

    def __init__(self):
        self.seen: list[tuple[str, dict, bytes]] = []
        self.open = 0
        self.after_end = 0  # bytes the "after-done" stream wrote past data: [DONE]
        self.release = threading.Event()  # lets the "stats-every" stream end
        self.released = False  # it was released, not tired of waiting
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(
                asyncio.start_server(self.handle, "127.0.0.1", 0, backlog=1024)
            )
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        async def shutdown():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def handle(self, reader, writer):
        self.open += 1
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            path = head[0].split(" ")[1]
            headers = {}
            for line in head[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", 0)))
            self.seen.append((path, headers, body))
            await self.answer(headers.get("x-fake-mode", "ok"), reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.open -= 1

    @staticmethod
    def head(status: int, kind: str, length: int | None = None, connection: str = "close") -> bytes:
        lines = [f"HTTP/1.1 {status} X", f"Content-Type: {kind}", f"Connection: {connection}"]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def answer(self, mode: str, reader, writer):
        write = writer.write
        if mode == "hang":  # until the gateway closes the connection
            await reader.read(1)
            return
        if mode.startswith("slow:"):  # an answer after this many seconds
            await asyncio.sleep(float(mode[5:]))
            mode = "ok"
        if mode.startswith("json:"):  # an answer of this many bytes (padding in the content)
            size = int(mode[5:])
            body = answer_json({"pad": "p" * size})
            write(self.head(200, "application/json", len(body)))
            for i in range(0, len(body), 1 << 16):
                write(body[i : i + (1 << 16)])
                await writer.drain()
            return
        bodies = {
            "ok": answer_json(),
            "nostats": json.dumps({"choices": [{"message": {"content": "ok"}}]}).encode(),
            "deep": b'{"timings": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "surrogate": answer_json().replace(b'"ok"', b'"ok\\ud800"'),
            "error500": b'{"error": {"message": "engine down"}}',
        }
        if mode == "nominates":  # a header that its Connection header names, and one it does not
            head = self.head(200, "application/json", len(bodies["ok"]), "close, X-Engine-Hop")
            hop = b"\r\nX-Engine-Hop: private\r\nX-Engine-Kept: public\r\n\r\n"
            write(head[:-4] + hop + bodies["ok"])
        elif mode in bodies:
            status = 500 if mode == "error500" else 200
            write(self.head(status, "application/json", len(bodies[mode])) + bodies[mode])
        elif mode == "short":  # the connection closes 990 bytes early
            write(self.head(200, "application/json", 1000) + b'{"timings"')
        elif mode in ("stream", "stream-nostats", "stream-slow"):
            write(self.head(200, "text/event-stream"))
            for _ in range(3):
                write(sse(CHUNK))
                await writer.drain()
            if mode == "stream-slow":  # the statistics, and the end half a second later
                write(sse(FINAL))
                await writer.drain()
                await asyncio.sleep(0.5)
                write(sse("[DONE]"))
            else:
                write(sse(*([] if mode == "stream-nostats" else [FINAL]), "[DONE]"))
        elif mode.startswith("after-done:"):  # a whole stream, then this many bytes more
            write(self.head(200, "text/event-stream") + sse(CHUNK, FINAL, "[DONE]"))
            junk = b"j" * (1 << 16)
            while self.after_end < int(mode[11:]):
                write(junk)
                await writer.drain()  # raises once the gateway has closed the connection
                self.after_end += len(junk)
        elif mode == "stats-every":  # statistics in every event, the end once released
            write(self.head(200, "text/event-stream"))
            for i in range(3):
                write(sse({**FINAL, "i": i}))
                await writer.drain()
                await asyncio.sleep(0.2)
            wait = self.release.wait
            self.released = await asyncio.get_running_loop().run_in_executor(None, wait, 10)
            write(sse("[DONE]"))
        elif mode == "endless-line":  # 4 MiB of one line, then its stats (in the same line)
            write(self.head(200, "text/event-stream") + sse(CHUNK) + b'data: {"pad": "')
            for _ in range(64):
                write(b"a" * (1 << 16))
                await writer.drain()
            write(b'", "timings": ' + json.dumps(TIMINGS).encode() + b"}\n\ndata: [DONE]\n\n")
        await writer.drain()


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


class ServedGateway(Served):
    """The gateway's app served as ``specscope gateway`` serves it (:func:`gateway_server`, its
    h11 protocol, limits and exception handler) on a free local port, in a thread."""

    def __init__(self, app, limits: GatewayLimits, backend_urls: int):
        sock = listen("127.0.0.1", 0)
        self.server = gateway_server(app, limits, backend_urls)
        self.thread = threading.Thread(
            target=asyncio.run, args=(run_server(self.server, sock),), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"


def read_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def post(url: str, text: str = CODE, mode: str = "ok", prompt_id: str | None = None, **kw):
    headers = {"X-Fake-Mode": mode, **({"X-Prompt-Id": prompt_id} if prompt_id else {})}
    return httpx.post(
        url + "/v1/chat/completions",
        headers=headers,
        json={"messages": [{"role": "user", "content": text}], **kw},
        timeout=30,
    )


@pytest.fixture()
def backend():
    fake = FakeBackend()
    yield fake
    fake.stop()


@pytest.fixture()
def gateway(backend, tmp_path):
    """``start(**limits)`` -> (gateway URL, request log); code and chat both on ``backend``."""
    servers = []

    def start(deployment=None, observers=(), predictions=None, **limits):
        deployment = deployment or Deployment(
            "llama.cpp", {"code": Backend(backend.url, "code")}, Backend(backend.url, "plain")
        )
        log = tmp_path / "gateway.jsonl"
        limits = GatewayLimits(**limits)
        served = ServedGateway(
            make_app(deployment, log, None, limits, observers, predictions),
            limits,
            len(deployment.backend_urls()),
        )
        servers.append(served)
        return served.url, log

    yield start
    for served in servers:
        served.stop()


# --- deployments checked at start --------------------------------------------------------------


@pytest.mark.parametrize(
    "url, message",
    [
        ("http://127.0.0.1:8080/v1?x=1#frag", "has a query or fragment"),
        ("http://127.0.0.1:8080/#frag", "has a query or fragment"),
        ("http://127.0.0.1:8080 /x", "holds the character ' '"),
        ("http://127.0.0.1:8080/\r\nX-Injected: 1", "holds the character '\\r'"),
        ("http://127.0.0.1:99999", "the port must be a number in 1..65535"),
        ("http://127.0.0.1:0", "the port must be a number in 1..65535"),
        ("http://127.0.0.1:", "the port must be a number in 1..65535"),
        ("http://a@b@127.0.0.1:1", "holds '@' more than once"),
        ("file:///etc/passwd", "url must be an http:// or https:// base URL with a host"),
        ("http://[::1", "url is not a URL"),
    ],
)
def test_backend_urls_that_would_misroute_are_refused_at_start(tmp_path, url, message):
    path = tmp_path / "deployment.toml"
    path.write_text(f"[fallback]\nurl = {json.dumps(url)}\n")
    with pytest.raises(DeploymentError) as e:
        Deployment.load(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    result = CliRunner().invoke(app, ["gateway", str(path), "--log", str(tmp_path / "g.jsonl")])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "g.jsonl").exists()


def export_document(tmp_path, **routing_changes) -> Path:
    from specscope.serving.export import export_policy
    from specscope.serving.export_plan import ExportOptions
    from specscope.serving.llamacpp.study import chain
    from specscope.tune.policy import PolicyFile

    policy = PolicyFile({"code": chain(3), "math": None, "reasoning": None, "chat": None})
    document = export_policy(policy, "llama.cpp", ExportOptions(draft="d.gguf", target="t.gguf"))
    for key, value in routing_changes.items():
        document["routing"]["rules"][0][key] = value
    path = tmp_path / "export.json"
    path.write_text(json.dumps(document))
    return path


def test_a_backend_for_a_domain_the_export_lacks_is_refused(tmp_path):
    path = export_document(tmp_path)
    with pytest.raises(DeploymentError) as e:
        Deployment.load(path, {"mth": "http://127.0.0.1:1", "*": "http://127.0.0.1:1"})
    assert str(e.value) == (
        f"--url mth=...: {path} has no domain 'mth'; allowed: code, math, reasoning, chat "
        "(or --url URL for all)"
    )
    result = CliRunner().invoke(
        app,
        ["gateway", str(path), "--url", "mth=http://127.0.0.1:1", "--url", "http://h:1"],
    )
    assert result.exit_code == 2 and "has no domain 'mth'" in result.output
    with pytest.raises(DeploymentError, match="--url code: url .* has a query"):
        Deployment.load(path, {"code": "http://h:1/?x", "*": "http://h:1"})


def test_an_export_rule_that_does_not_compile_or_weighs_nan_is_refused_at_start(tmp_path):
    with pytest.raises(DeploymentError, match="routing rule unreadable"):
        Deployment.load(export_document(tmp_path, pattern="("), {"*": "http://h:1"})
    with pytest.raises(DeploymentError, match="weight must be a finite number, got nan"):
        Deployment.load(export_document(tmp_path, weight="nan"), {"*": "http://h:1"})


# --- the logs' files ---------------------------------------------------------------------------


def test_planted_links_at_either_log_are_refused_and_nothing_is_written_through_them(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("kept\n")
    log = tmp_path / "gateway.jsonl"
    errors_path(log).symlink_to(outside)
    with pytest.raises(
        GatewayError, match="--errors-log .*gateway.errors.jsonl is a symbolic link"
    ):
        open_logs(log)
    errors_path(log).unlink()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(GatewayError, match="--log .*dangling is a symbolic link"):
        open_logs(tmp_path / "dangling")
    assert outside.read_text() == "kept\n" and not (tmp_path / "nowhere.jsonl").exists()


def test_a_log_that_is_no_regular_file_needs_an_errors_log_and_the_two_must_differ(tmp_path):
    with pytest.raises(GatewayError, match="--log /dev/null is not a regular file"):
        open_logs("/dev/null")
    assert not Path("/dev/null.errors.jsonl").exists()
    logs = open_logs("/dev/null", "/dev/null")  # both discarded: allowed
    logs["requests"].append({"a": 1})
    for opened in logs.values():
        opened.close()
    log = tmp_path / "g.jsonl"
    with pytest.raises(GatewayError, match="is the request log"):
        open_logs(log, log)
    with pytest.raises(GatewayError, match="is the request log"):
        open_logs(log, tmp_path / "." / "g.jsonl")


def test_a_full_disk_leaves_no_torn_line(tmp_path, monkeypatch):
    log = RequestLog(tmp_path / "g.jsonl")
    log.append({"n": 1})
    real, calls = os.write, []

    def full(fd, data):  # a short write, then no space left
        calls.append(len(data))
        if fd != log._fd:
            return real(fd, data)
        if len(calls) == 1:
            return real(fd, bytes(data[:7]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gateway_logs.os, "write", full)
    with pytest.raises(OSError):
        log.append({"n": 2, "text": "x" * 100})
    monkeypatch.setattr(gateway_logs.os, "write", real)
    log.append({"n": 3})
    assert read_lines(tmp_path / "g.jsonl") == [{"n": 1}, {"n": 3}]
    # short writes are continued: a line written in 3-byte pieces is whole
    monkeypatch.setattr(gateway_logs.os, "write", lambda fd, data: real(fd, bytes(data[:3])))
    log.append({"n": 4, "s": "ok\ud800"})  # a lone surrogate: escaped, the line stays JSON
    monkeypatch.setattr(gateway_logs.os, "write", real)
    assert read_lines(tmp_path / "g.jsonl")[-1] == {"n": 4, "s": "ok\ud800"}


def test_sse_scanner_holds_at_most_one_bounded_line():
    scanner = SseScanner(max_line=64)
    assert scanner.feed(b'data: {"a": 1}\n\ndata: {"b"') == [{"a": 1}]
    assert scanner.feed(b": 2}\n") == [{"b": 2}]
    assert scanner.feed(b"data: " + b"x" * 100) == [] and scanner.overlong
    for _ in range(1000):  # an endless line: nothing held
        scanner.feed(b"y" * 1000)
        assert len(scanner._line) == 0
    assert scanner.past_end is None
    assert scanner.feed(b'zz\ndata: {"c": 3}\ndata: [DONE]\nabc') == [{"c": 3}] and scanner.done
    assert scanner.past_end == 3  # the bytes of that chunk after the end line


# --- requests at the edges ---------------------------------------------------------------------


def test_nested_or_non_finite_requests_are_400_and_the_body_limit_is_413(gateway, backend):
    url, log = gateway(max_request_bytes=300_000)
    deep = httpx.post(url + "/v1/chat/completions", content=b"[" * 100_000 + b"]" * 100_000)
    nan = httpx.post(url + "/v1/chat/completions", content=b'{"messages": [], "temperature": NaN}')
    big = httpx.post(url + "/v1/chat/completions", content=b'{"p": "' + b"x" * 400_000 + b'"}')
    chunked = httpx.post(  # no Content-Length: counted as it arrives
        url + "/v1/chat/completions", content=iter([b'{"p": "'] + [b"x" * 1000] * 400 + [b'"}'])
    )
    assert [(a.status_code, a.json()["error"]["message"]) for a in (deep, nan, big, chunked)] == [
        (400, "the request body is nested too deeply"),
        (400, "the request body holds NaN; JSON numbers must be finite"),
        (413, "the request body is larger than the gateway's limit of 300000 bytes"),
        (413, "the request body is larger than the gateway's limit of 300000 bytes"),
    ]
    assert backend.seen == [] and read_lines(log) == []
    assert [x["status"] for x in read_lines(errors_path(log))] == [400, 400, 413, 413]
    # a declared 200 MB body is refused before it is sent
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200000000\r\n\r\n{"
        )
        assert s.recv(100).startswith(b"HTTP/1.1 413")


def test_utf8_prompt_ids_json_content_type_and_no_credentials_shown(gateway, backend, tmp_path):
    secret = Backend(f"http://user:hunter2@127.0.0.1:{backend.port}", "code")
    down = Backend(f"http://user:hunter2@127.0.0.1:{free_port()}", "reasoning")
    url, log = gateway(
        Deployment("llama.cpp", {"code": secret, "reasoning": down}, Backend(backend.url, "plain"))
    )
    answer = httpx.post(
        url + "/v1/chat/completions",
        headers={
            "X-Prompt-Id": "héllo-日本".encode(),
            "Content-Type": "application/x-www-form-urlencoded",  # curl -d's
        },
        # a lone surrogate (a valid JSON escape) is forwarded as one
        content=json.dumps({"messages": [{"role": "user", "content": CODE + "\ud800"}]}),
    )
    assert answer.status_code == 200
    ((path, headers, body),) = backend.seen
    assert headers["content-type"] == "application/json"
    assert headers["authorization"] == "Basic " + base64.b64encode(b"user:hunter2").decode()
    assert json.loads(body)["model"] == "code"
    assert json.loads(body)["messages"][0]["content"] == CODE + "\ud800"
    (line,) = read_lines(log)
    assert (line["prompt_id"], line["backend"]) == (
        "héllo-日本",
        f"http://***@127.0.0.1:{backend.port}",
    )
    unreachable = post(url, "How many apples are left if Tom buys 3 and eats 2?", prompt_id="r")
    assert unreachable.status_code == 502
    assert (
        unreachable.json()["error"]["backend"]
        == down.display
        == down.url.replace("user:hunter2@", "***@")
    )
    health = httpx.get(url + "/health").text
    assert "hunter2" not in health + unreachable.text and "***@" in health
    assert "hunter2" not in log.read_text() + errors_path(log).read_text()


def test_backend_faults_are_json_502s_or_relayed_and_always_logged(gateway, backend, tmp_path):
    url, log = gateway(max_answer_bytes=1 << 20)
    short = post(url, mode="short", prompt_id="short")
    huge = post(url, mode=f"json:{2 << 20}", prompt_id="huge")
    for answer in (short, huge):
        error = answer.json()["error"]
        assert answer.status_code == 502 and (error["domain"], error["backend"]) == (
            "code",
            backend.url,
        )
        assert "Traceback" not in answer.text
    assert "RemoteProtocolError" in short.json()["error"]["message"]
    assert "more than the gateway's limit of 1048576 bytes" in huge.json()["error"]["message"]
    deep = post(url, mode="deep", prompt_id="deep")  # relayed as the engine sent it
    assert deep.status_code == 200 and len(deep.content) == 200_013
    surrogate = post(url, mode="surrogate", prompt_id="surrogate")
    assert surrogate.status_code == 200
    assert surrogate.json()["choices"][0]["message"]["content"] == "ok\ud800"
    engine = post(url, mode="error500", prompt_id="engine")
    assert engine.status_code == 500 and engine.json() == {"error": {"message": "engine down"}}
    errors = {x["prompt_id"]: x for x in read_lines(errors_path(log))}
    assert {k: x["status"] for k, x in errors.items()} == {
        "short": 502,
        "huge": 502,
        "deep": 200,
        "engine": 500,
    }
    assert errors["deep"]["error"] == "the engine's answer is nested too deeply to read"
    (line,) = read_lines(log)  # the surrogate's answer carries timings: ingestible
    assert line["prompt_id"] == "surrogate" and line["response"]["timings"] == TIMINGS
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "surrogate", "domain": "code", "prompt": CODE}) + "\n")
    assert ingest(log, "llama.cpp", prompts, tmp_path / "run")["counts"]["requests"] == 1


@pytest.mark.parametrize(
    "engine, hint",
    [("llama.cpp", "llama-server adds timings"), ("vllm", "stream_options.include_usage")],
)
def test_answers_without_statistics_go_to_the_errors_log(gateway, backend, engine, hint):
    url, log = gateway(Deployment(engine, {}, Backend(backend.url)))
    key = gw.ENGINE_STATS_KEY[engine]
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        headers={"X-Fake-Mode": "stream-nostats", "X-Prompt-Id": "s"},
        json={"messages": [{"role": "user", "content": CHAT}], "stream": True},
    ) as answer:
        received = answer.read()
    assert received == sse(CHUNK, CHUNK, CHUNK, "[DONE]")
    assert post(url, CHAT, mode="nostats", prompt_id="n").status_code == 200
    assert read_lines(log) == []
    errors = read_lines(errors_path(log))
    assert [(x["prompt_id"], x["status"]) for x in errors] == [("s", 200), ("n", 200)]
    for x in errors:
        assert x["error"].startswith(f"the answer carries no {key} (") and hint in x["error"]
    # the engine's answer is kept, as "answer": no errors-log line has a "response" to ingest
    assert errors[0]["answer"] == CHUNK and errors[0]["stream"] is True
    assert errors[1]["answer"] == {"choices": [{"message": {"content": "ok"}}]}


def test_an_endless_sse_line_is_relayed_but_not_held(gateway, backend):
    url, log = gateway(max_event_bytes=1 << 16)
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        headers={"X-Fake-Mode": "endless-line", "X-Prompt-Id": "e"},
        json={"messages": [{"role": "user", "content": CODE}], "stream": True},
    ) as answer:
        size = sum(len(c) for c in answer.iter_bytes())
    assert size > 64 << 16
    (error,) = read_lines(errors_path(log))
    assert error["error"].startswith(
        "an event line longer than 65536 bytes was relayed unread, and the answer carries no timings"
    )


def test_a_stream_with_statistics_is_logged_before_its_end_reaches_the_client(gateway, backend):
    url, log = gateway()
    seen_at_end = []
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        headers={"X-Fake-Mode": "stream-slow", "X-Prompt-Id": "s1"},
        json={"messages": [{"role": "user", "content": CODE}], "stream": True},
    ) as answer:
        received = b""
        for chunk in answer.iter_raw():
            received += chunk
            if b"timings" in received and not seen_at_end:
                seen_at_end.append(read_lines(log))
    assert received == sse(CHUNK, CHUNK, CHUNK, FINAL, "[DONE]")
    assert [x["prompt_id"] for x in seen_at_end[0]] == ["s1"]  # written before the stats arrived
    (line,) = read_lines(log)
    assert line["response"] == FINAL and line["status"] == 200 and line["stream"] is True


def test_bytes_past_a_streams_end_are_relayed_up_to_the_cap_and_never_held(gateway, backend):
    url, log = gateway(max_answer_bytes=1 << 20)
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        headers={"X-Fake-Mode": f"after-done:{48 << 20}", "X-Prompt-Id": "d"},
        json={"messages": [{"role": "user", "content": CODE}], "stream": True},
        timeout=30,
    ) as answer:
        received = b"".join(answer.iter_raw())
    whole = sse(CHUNK, FINAL, "[DONE]")
    assert received.startswith(whole)
    assert len(received) - len(whole) <= 1 << 20  # at most max_answer_bytes past the end
    deadline = time.monotonic() + 5
    while backend.open and time.monotonic() < deadline:
        time.sleep(0.02)
    # the gateway stopped reading and closed the connection: the engine's 48 MiB never went
    # through (what it wrote is the cap and the two sockets' buffers)
    assert backend.open == 0 and backend.after_end < 16 << 20
    (line,) = read_lines(log)  # the stream was whole at its end: logged as answered
    assert (line["prompt_id"], line["status"], line["response"]) == ("d", 200, FINAL)


def test_a_stream_with_statistics_in_every_event_is_relayed_as_it_comes(gateway, backend):
    url, log = gateway()
    seen_at_end = []
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        headers={"X-Fake-Mode": "stats-every", "X-Prompt-Id": "every"},
        json={"messages": [{"role": "user", "content": CODE}], "stream": True},
    ) as answer:
        received = b""
        for chunk in answer.iter_raw():
            received += chunk
            if b'"i": 0' in received:  # the first event came before the engine's end
                backend.release.set()
            if b"[DONE]" in received and not seen_at_end:
                seen_at_end.append(read_lines(log))
    assert backend.released  # the engine was not still waiting when it ended the stream
    assert received == sse(*({**FINAL, "i": i} for i in range(3)), "[DONE]")
    assert [x["response"]["i"] for x in seen_at_end[0]] == [2]  # the last statistics, logged


# --- isolation ---------------------------------------------------------------------------------


def test_a_client_that_leaves_cancels_its_upstream_request(gateway, backend):
    url, log = gateway()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            url + "/v1/chat/completions",
            headers={"X-Fake-Mode": "hang", "X-Prompt-Id": "gone"},
            json={"messages": [{"role": "user", "content": CODE}]},
            timeout=0.5,
        )
    deadline = time.monotonic() + 5
    while backend.open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend.open == 0  # the gateway closed its upstream connection
    (error,) = read_lines(errors_path(log))
    assert (error["prompt_id"], error["status"]) == ("gone", 499)


def chat_requests(url: str, n: int = 10) -> None:
    """``n`` chat requests one after another, each answered by the chat backend in time."""
    with httpx.Client(timeout=10) as client:
        for _ in range(n):
            answer = client.post(
                url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": CHAT}]},
            )
            assert answer.status_code == 200 and answer.headers["x-specscope-domain"] == "chat"


@pytest.mark.slow
def test_a_hanging_backend_holds_up_only_its_own_domain(gateway, backend, tmp_path):
    hanging = FakeBackend()
    try:
        url, log = gateway(
            Deployment(
                "llama.cpp", {"code": Backend(hanging.url, "code")}, Backend(backend.url, "plain")
            ),
            max_in_flight=200,
        )
        chat_requests(url)

        results: dict = {}

        def run_flood():
            async def main():
                async with httpx.AsyncClient(
                    timeout=20, limits=httpx.Limits(max_connections=300)
                ) as client:
                    results["answers"] = await asyncio.gather(
                        *(
                            client.post(
                                url + "/v1/chat/completions",
                                headers={"X-Fake-Mode": "hang"},
                                json={"messages": [{"role": "user", "content": CODE}]},
                            )
                            for _ in range(210)
                        ),
                        return_exceptions=True,
                    )

            asyncio.run(main())

        flood_thread = threading.Thread(target=run_flood)
        flood_thread.start()
        deadline = time.monotonic() + 15
        while hanging.open < 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # the 10 beyond the limit have been refused
        assert hanging.open == 200  # 200 in flight to the hanging backend, no more
        # the chat domain is served while 200 requests hang on the code backend (with one
        # pool for all backends, these wait for a free connection and time out); its latency
        # against the unloaded one is measured by benchmarks/bench_gateway_load.py
        chat_requests(url)
        assert httpx.get(url + "/health", timeout=5).json()["in_flight"] == 200
        flood_thread.join(40)
        busy = [a for a in results["answers"] if isinstance(a, httpx.Response)]
        assert [a.status_code for a in busy] == [503] * 10  # the other 200 timed out
        assert busy[0].json()["error"]["type"] == "backend_busy"
    finally:
        hanging.stop()


def test_slow_classification_does_not_block_other_requests(gateway, backend):
    class SlowRouter(RuleRouter):
        def classify(self, text):
            if "slow" in text:
                time.sleep(2)
            return super().classify(text)

    url, log = gateway(Deployment("llama.cpp", {}, Backend(backend.url), SlowRouter()))
    thread = threading.Thread(target=post, args=(url, "slow " * 10))
    thread.start()
    time.sleep(0.3)
    start = time.perf_counter()
    assert httpx.get(url + "/health").status_code == 200
    assert post(url, CHAT).status_code == 200
    assert time.perf_counter() - start < 1.0
    thread.join()


def test_200_concurrent_requests_give_200_intact_lines_with_their_own_ids(
    gateway, backend, tmp_path
):
    url, log = gateway(max_in_flight=256)

    async def one(client, i):
        mode = "stream" if i % 3 == 0 else "ok"
        text = (CODE, CHAT)[i % 2]
        answer = await client.post(
            url + "/v1/chat/completions",
            headers={"X-Fake-Mode": mode, "X-Prompt-Id": f"p{i}"},
            json={"messages": [{"role": "user", "content": text}], "stream": mode == "stream"},
        )
        return answer.status_code

    async def main():
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200)) as c:
            return await asyncio.gather(*(one(c, i) for i in range(200)))

    assert asyncio.run(main()) == [200] * 200
    lines = read_lines(log)
    assert sorted(x["prompt_id"] for x in lines) == sorted(f"p{i}" for i in range(200))
    assert all(x["domain"] == ("code", "chat")[int(x["prompt_id"][1:]) % 2] for x in lines)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "domain": ("code", "chat")[i % 2], "prompt": "x"}) + "\n"
            for i in range(200)
        )
    )
    assert ingest(log, "llama.cpp", prompts, tmp_path / "run")["counts"]["requests"] == 200


def test_a_full_disk_answers_200_and_leaves_no_torn_line(gateway, backend, monkeypatch, capfd):
    url, log = gateway()
    assert post(url, prompt_id="before").status_code == 200
    real = os.write
    fd = os.open(log, os.O_RDONLY)  # the log's inode, to recognise the gateway's descriptor
    inode = os.fstat(fd).st_ino
    os.close(fd)

    def full(fd, data):
        if os.fstat(fd).st_ino != inode:
            return real(fd, data)
        if len(data) > 20:
            return real(fd, bytes(data[:20]))  # a short write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gateway_logs.os, "write", full)
    answers = [post(url, prompt_id=f"full{i}") for i in range(3)]
    monkeypatch.setattr(gateway_logs.os, "write", real)
    assert [a.status_code for a in answers] == [200] * 3
    assert [a.json()["timings"] for a in answers] == [TIMINGS] * 3
    assert post(url, prompt_id="after").status_code == 200
    assert [x["prompt_id"] for x in read_lines(log)] == ["before", "after"]  # every line whole
    errors = read_lines(errors_path(log))
    assert [x["prompt_id"] for x in errors] == ["full0", "full1", "full2"]
    assert all("could not be written: No space left on device" in x["error"] for x in errors)


def test_observers_see_every_record_and_metrics_count_them(gateway, backend, tmp_path):
    seen = []
    predictions = {"code": Prediction(1.5, 1.4, 1.6), "*": None}
    url, log = gateway(
        observers=[lambda kind, entry: seen.append((kind, entry))], predictions=predictions
    )
    post(url, prompt_id="a")
    post(url, mode="error500", prompt_id="b")
    post(url, text=CHAT, prompt_id="c")
    assert [(k, e["prompt_id"], e["status"]) for k, e in seen] == [
        ("requests", "a", 200),
        ("errors", "b", 500),
        ("requests", "c", 200),
    ]
    assert all(isinstance(e["latency_s"], float) and 0 < e["latency_s"] < 30 for _, e in seen)
    exposition = httpx.get(url + "/metrics")
    assert exposition.headers["content-type"].startswith("text/plain")
    text = exposition.text
    # llama-server logs no verify steps here: ingest derives predicted_n - 1 - accepted
    accepted = TIMINGS["draft_n_accepted"]
    steps = TIMINGS["predicted_n"] - 1 - accepted
    expected = {
        'specscope_gateway_requests_total{domain="code"}': 1.0,
        'specscope_gateway_requests_total{domain="chat"}': 1.0,
        'specscope_gateway_request_errors_total{domain="code",status="500"}': 1.0,
        'specscope_gateway_verify_steps_total{domain="code"}': float(steps),
        'specscope_gateway_accepted_tokens_total{domain="code"}': float(accepted),
        'specscope_gateway_draft_tokens_total{domain="code"}': float(TIMINGS["draft_n"]),
        'specscope_gateway_generation_tokens_total{domain="code"}': float(TIMINGS["predicted_n"]),
        'specscope_gateway_request_latency_seconds_count{domain="code"}': 2.0,
        'specscope_gateway_predicted_tokens_per_step{bound="low",domain="code"}': 1.4,
        'specscope_gateway_tokens_per_step{bound="mid",domain="code"}': (steps + accepted) / steps,
    }
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert {k: float(values[k]) for k in expected} == pytest.approx(expected)
    assert values['specscope_gateway_drift{domain="code"}'] == "NaN"  # one request: not testable


def test_a_bug_is_a_json_500_without_a_traceback(gateway, backend):
    class Broken(RuleRouter):
        def classify(self, text):
            raise KeyError("boom")

    url, log = gateway(Deployment("llama.cpp", {}, Backend(backend.url), Broken()))
    answer = post(url)
    assert answer.status_code == 500 and "Traceback" not in answer.text
    assert answer.json()["error"]["message"] == "the gateway failed: KeyError: 'boom'"
    assert read_lines(errors_path(log))[0]["status"] == 500


def test_headers_named_by_connection_are_not_forwarded_either_way(gateway, backend):
    url, log = gateway()
    answer = httpx.post(
        url + "/v1/chat/completions",
        headers={
            "Connection": "keep-alive, X-Internal-Token ,x-OTHER",
            "X-Internal-Token": "secret",
            "X-Other": "o",
            "X-Kept": "k",
            "X-Fake-Mode": "nominates",
        },
        json={"messages": [{"role": "user", "content": CODE}]},
    )
    assert answer.status_code == 200
    (_, headers, _), *_ = backend.seen
    assert "x-internal-token" not in headers and "x-other" not in headers
    assert headers["x-kept"] == "k"
    assert headers["accept-encoding"] == "identity"  # nothing compressed to inflate unbounded
    assert "x-engine-hop" not in answer.headers and answer.headers["x-engine-kept"] == "public"


# --- bounded in time ---------------------------------------------------------------------------


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def until_closed(sock: socket.socket, limit: float, trickle: bytes = b"") -> tuple[float, bytes]:
    """Seconds until the server closes ``sock`` (``limit`` if it does not), and what it sent;
    with ``trickle``, one line of it is sent every 0.1 s meanwhile."""
    start, received = time.monotonic(), b""
    lines = iter(trickle.splitlines(keepends=True))
    while (elapsed := time.monotonic() - start) < limit:
        if select.select([sock], [], [], 0.1)[0]:
            try:
                data = sock.recv(65536)
            except ConnectionError:
                return elapsed, received
            if not data:
                return elapsed, received
            received += data
        elif (line := next(lines, None)) is not None:
            try:
                sock.sendall(line)
            except ConnectionError:
                return elapsed, received
    return limit, received


def health(sock: socket.socket) -> bytes:
    """GET /health on a kept-alive connection; the whole answer."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return answer


SLOW_HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n" + b"".join(
    b"X-Slow-%d: 1\r\n" % i for i in range(40)
)


def test_a_client_slow_with_its_headers_is_cut_off_at_the_deadline(gateway, backend):
    url, log = gateway(header_timeout=0.5)
    with socket.create_connection(("127.0.0.1", port_of(url))) as sock:
        elapsed, received = until_closed(sock, 4.0, SLOW_HEADERS)  # a header line every 0.1 s
    assert 0.4 < elapsed < 2.0
    assert received.startswith(b"HTTP/1.1 408 ")
    # a kept-alive connection: the deadline counts from the end of the answer before
    with socket.create_connection(("127.0.0.1", port_of(url))) as sock:
        assert health(sock).startswith(b"HTTP/1.1 200 ")
        elapsed, received = until_closed(sock, 4.0, SLOW_HEADERS)
    assert 0.4 < elapsed < 2.0 and received.startswith(b"HTTP/1.1 408 ")
    # a client in time is served on one connection, its answers slower than the deadline
    with httpx.Client(timeout=10) as client:
        for _ in range(2):
            answer = client.post(
                url + "/v1/chat/completions",
                headers={"X-Fake-Mode": "slow:1"},
                json={"messages": [{"role": "user", "content": CODE}]},
            )
            assert answer.status_code == 200 and answer.json()["timings"] == TIMINGS
    assert len(backend.seen) == 2 and len(read_lines(log)) == 2


def test_a_silent_client_and_an_idle_kept_alive_one_are_closed(gateway, backend):
    url, log = gateway(header_timeout=0.5, keep_alive_timeout=0.3)
    with socket.create_connection(("127.0.0.1", port_of(url))) as sock:
        elapsed, received = until_closed(sock, 4.0)
    assert 0.4 < elapsed < 2.0 and received == b""  # nothing began: closed without a word
    with socket.create_connection(("127.0.0.1", port_of(url))) as sock:
        assert health(sock).startswith(b"HTTP/1.1 200 ")
        elapsed, received = until_closed(sock, 4.0)
    assert 0.2 < elapsed < 1.5 and received == b""


def test_connections_beyond_the_servers_bound_get_a_503(gateway, backend):
    # one backend URL, max_in_flight 1: the server takes 2 connections at once
    url, log = gateway(max_in_flight=1)
    assert post(url).status_code == 200
    with socket.create_connection(("127.0.0.1", port_of(url))):  # an idle connection open
        time.sleep(0.2)
        refused = post(url)
    assert refused.status_code == 503 and refused.text == "Service Unavailable"
    assert post(url).status_code == 200
    server = gateway_server(None, GatewayLimits(max_in_flight=3), 2)
    assert server.config.limit_concurrency == server.config.backlog == 9


def test_accept_failures_are_one_line_per_interval_with_the_count_of_the_rest():
    lines, now = [], [0.0]

    class Loop:
        def default_exception_handler(self, context):
            lines.append(("default", context["message"]))

    handler = AcceptFailureLog(interval=10, clock=lambda: now[0], write=lines.append)
    emfile = OSError(errno.EMFILE, "Too many open files")
    context = {"message": "socket.accept() out of system resource", "exception": emfile}
    for t in [0.0] + [0.5] * 2048 + [9.9, 10.2, 11.0, 25.0]:
        now[0] = t
        handler(Loop(), context)
    handler(Loop(), {"message": "something else", "exception": ValueError("x")})
    assert len(lines) == 4
    assert lines[0].startswith(
        "specscope gateway: socket.accept() out of system resource: Too many open files ("
    )
    assert "2049 more in the 10 s since the line before" in lines[1]
    assert "1 more in the 15 s since the line before" in lines[2]
    assert lines[3] == ("default", "something else")


# --- the command -------------------------------------------------------------------------------


def test_a_port_in_use_or_a_bogus_host_is_exit_2(tmp_path, backend):
    path = tmp_path / "deployment.toml"
    path.write_text(f'[fallback]\nurl = "http://u:hunter2@127.0.0.1:{backend.port}"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            app, ["gateway", str(path), "--port", str(port), "--log", str(tmp_path / "g.jsonl")]
        )
    assert result.exit_code == 2
    assert f"error: cannot listen on 127.0.0.1:{port} (Address already in use)" in result.output
    assert f"other: http://***@127.0.0.1:{backend.port}" in result.output
    assert "hunter2" not in result.output
    result = CliRunner().invoke(app, ["gateway", str(path), "--host", "999.1.1.1"])
    assert result.exit_code == 2 and "error: --host 999.1.1.1: cannot listen there" in result.output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gateway(
    tmp_path, backend, *options, stderr=subprocess.PIPE
) -> tuple[subprocess.Popen, str, Path]:
    path = tmp_path / "deployment.toml"
    path.write_text(
        f'[domains.code]\nurl = "{backend.url}"\nmodel = "code"\n'
        f'[fallback]\nurl = "{backend.url}"\n'
    )
    port, log = free_port(), tmp_path / "gateway.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from specscope.cli import app; app()",
            "gateway",
            str(path),
            "--port",
            str(port),
            "--log",
            str(log),
            *options,
        ],
        stderr=stderr,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url + "/health", timeout=1)
            return process, url, log
        except httpx.TransportError:
            assert process.poll() is None, process.stderr and process.stderr.read().decode()
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)


def test_sigterm_with_a_request_on_a_hanging_backend_stops_and_logs_it(tmp_path, backend):
    process, url, log = start_gateway(tmp_path, backend, "--graceful-timeout", "1")

    def stuck():
        with pytest.raises(httpx.TransportError):  # the gateway stops without answering
            post(url, mode="hang", prompt_id="stuck")

    client = threading.Thread(target=stuck)
    client.daemon = True
    client.start()
    deadline = time.monotonic() + 10
    while not backend.open and time.monotonic() < deadline:
        time.sleep(0.02)
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(15)
    assert time.monotonic() - start < 5  # 1 s of grace, then the stop
    (error,) = read_lines(errors_path(log))
    assert (error["prompt_id"], error["status"], error["error"]) == ("stuck", 503, STOPPED)


def test_kill_9_after_n_answers_leaves_all_n_in_the_logs(tmp_path, backend):
    process, url, log = start_gateway(tmp_path, backend)
    modes = ["ok", "stream", "nostats", "error500"] * 5
    try:
        for i, mode in enumerate(modes):
            answer = post(url, CODE, mode=mode, prompt_id=f"k{i}", stream=mode == "stream")
            assert answer.status_code in (200, 500)
    finally:
        process.kill()
        process.wait(10)
    logged = {x["prompt_id"] for x in read_lines(log) + read_lines(errors_path(log))}
    assert logged == {f"k{i}" for i in range(len(modes))}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": x["prompt_id"], "domain": "code", "prompt": CODE}) + "\n"
            for x in read_lines(log)
        )
    )
    assert ingest(log, "llama.cpp", prompts, tmp_path / "run")["counts"]["requests"] == 10


@pytest.mark.slow
def test_out_of_descriptors_is_one_line_not_one_per_waiting_connection(tmp_path, backend):
    with open(tmp_path / "stderr.txt", "w+b") as stderr:
        process, url, log = start_gateway(tmp_path, backend, stderr=stderr)
        try:
            used = len(os.listdir(f"/proc/{process.pid}/fd"))
            limit = resource.prlimit(process.pid, resource.RLIMIT_NOFILE)
            resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (used + 4, limit[1]))
            clients = [socket.create_connection(("127.0.0.1", port_of(url))) for _ in range(60)]
            time.sleep(3)  # asyncio tries to accept them once a second
            for client in clients:
                client.close()
            resource.prlimit(process.pid, resource.RLIMIT_NOFILE, limit)
            time.sleep(1.5)  # the next try accepts them
            assert httpx.get(url + "/health", timeout=5).status_code == 200  # it recovered
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(15)
        stderr.seek(0)
        text = stderr.read().decode()
    (line,) = [x for x in text.splitlines() if "out of system resource" in x]
    assert "Too many open files" in line and "Traceback" not in text
