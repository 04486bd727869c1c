"""specscope gateway under load and abuse, on 127.0.0.1: what the issue asks it to show.

    python benchmarks/bench_gateway_load.py [--in-flight 200] [--out FILE.json]

The gateway runs as the real command (``specscope gateway``, a subprocess) in front of small
llama-server-shaped backends served here (uvicorn, in threads): a healthy one per domain that
answers after ``--answer-ms`` with ``timings`` that encode the prompt (so a joined line can be
checked against its own prompt), and a ``code`` backend that hangs. It prints:

1. isolation: the chat domain's latency (median and p95 of sequential requests) unloaded, and with
   ``--in-flight`` requests hanging on the code backend; their ratio (goal: within 2x);
2. classification: the gateway's own classification (request_text + Deployment.route) of 1 MB
   adversarial prompts, median ms in this process (goal: under 50 ms), and /health's latency
   through the gateway while such a request is classified;
3. kill -9: requests in flight (a third streamed) when the gateway is killed; every request that
   got a 200 answer must be in a log, and ``specscope ingest`` must read the request log;
4. joins: 200 concurrent requests of the four domains with their own X-Prompt-Id, ingested; every
   line must join its own prompt (checked by the statistics the backend derived from the prompt),
   and ``--join order`` must be refused.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pandas as pd
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from specscope.serving.gateway import Deployment, request_text

PROMPTS = {
    "code": "Write a python function that returns the sum of a list. Case {i}.",
    "math": "Find all real numbers x such that x^2 - 5x + {i} = 0.",
    "reasoning": "Tom has {i} apples and buys 3 more each day. How many apples in total after "
    "a week? Give your final answer.",
    "chat": "Describe a quiet morning in a small harbour town, scene {i}.",
}


def prompt_timings(text: str) -> dict:
    """llama-server timings that encode the prompt: a join can be checked against them."""
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    steps = 3 + h % 17
    accepted = (h >> 8) % (3 * steps + 1)  # at most the 4 * steps drafted
    return {
        "prompt_n": 12,
        "predicted_n": 1 + steps + accepted,
        "predicted_ms": 100.0,
        "draft_n": 4 * steps,
        "draft_n_accepted": accepted,
        "draft_n_verif_steps": steps,
    }


def backend(answer_s: float, hang: bool) -> Starlette:
    async def chat(request: Request):
        body = await request.json()
        if hang:
            await asyncio.Event().wait()
        text = request_text(body)
        await asyncio.sleep(answer_s)
        timings = prompt_timings(text)
        if body.get("stream"):

            async def events():
                for word in ("a", "b", "c"):
                    chunk = {
                        "object": "chat.completion.chunk",
                        "choices": [{"delta": {"content": word}, "index": 0}],
                    }
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                    await asyncio.sleep(answer_s)
                final = {
                    "object": "chat.completion.chunk",
                    "timings": timings,
                    "choices": [{"delta": {}, "finish_reason": "length", "index": 0}],
                }
                yield f"data: {json.dumps(final)}\n\n".encode() + b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        answer = {
            "id": "x",
            "object": "chat.completion",
            "timings": timings,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        }
        return JSONResponse(answer)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


class Served:
    def __init__(self, asgi):
        config = uvicorn.Config(
            asgi, host="127.0.0.1", port=0, log_level="error", limit_concurrency=None
        )
        self.server = uvicorn.Server(config)
        threading.Thread(target=self.server.run, daemon=True).start()
        while not self.server.started:
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """``specscope gateway`` as a subprocess."""

    def __init__(self, workdir: Path, urls: dict[str, str], extra: list[str]):
        deployment = workdir / "deployment.toml"
        lines = ['engine = "llama.cpp"']
        for domain, url in urls.items():
            lines += [f"[domains.{domain}]", f'url = "{url}"']
        lines += ["[fallback]", f'url = "{urls["chat"]}"']
        deployment.write_text("\n".join(lines) + "\n")
        self.log = workdir / "gateway.jsonl"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            "specscope",
            "gateway",
            str(deployment),
            "--port",
            str(self.port),
            "--log",
            str(self.log),
            *extra,
        ]
        self.process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.process.kill()
        raise SystemExit(f"the gateway did not start: {self.process.stderr.read()}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def body(domain: str, i: int, stream: bool = False) -> dict:
    return {
        "messages": [{"role": "user", "content": PROMPTS[domain].format(i=i)}],
        "stream": stream,
    }


def latencies(url: str, n: int) -> list[float]:
    out = []
    with httpx.Client(timeout=60) as client:
        for i in range(n):
            t = time.perf_counter()
            answer = client.post(url + "/v1/chat/completions", json=body("chat", i))
            out.append(time.perf_counter() - t)
            assert answer.status_code == 200, answer.text
    return out


def describe(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median_ms": 1e3 * statistics.median(xs), "p95_ms": 1e3 * xs[int(0.95 * (len(xs) - 1))]}


def isolation(workdir: Path, args) -> dict:
    healthy = Served(backend(args.answer_ms / 1e3, hang=False))
    hanging = Served(backend(0, hang=True))
    urls = {"code": hanging.url, "math": healthy.url, "reasoning": healthy.url, "chat": healthy.url}
    extra = ["--max-in-flight", str(args.in_flight), "--read-timeout", "600"]
    gateway = Gateway(workdir, urls, extra)
    try:
        latencies(gateway.url, 10)  # warm up
        unloaded = latencies(gateway.url, args.requests)
        statuses: list[int] = []

        async def hang_many(stop: asyncio.Event):
            limits = httpx.Limits(max_connections=args.in_flight + 50)
            async with httpx.AsyncClient(timeout=None, limits=limits) as client:

                async def one(i):
                    try:
                        r = await client.post(
                            gateway.url + "/v1/chat/completions", json=body("code", i)
                        )
                        statuses.append(r.status_code)
                    except (httpx.HTTPError, asyncio.CancelledError):
                        statuses.append(0)

                tasks = [asyncio.create_task(one(i)) for i in range(args.in_flight)]
                await stop.wait()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        loop = asyncio.new_event_loop()
        stop = asyncio.Event()
        thread = threading.Thread(target=loop.run_until_complete, args=(hang_many(stop),))
        thread.start()
        time.sleep(3)  # all of them reach the hanging backend
        loaded = latencies(gateway.url, args.requests)
        rejected = sum(s == 503 for s in statuses)
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        after = latencies(gateway.url, args.requests)  # the client left: upstreams cancelled
    finally:
        gateway.stop()
    return {
        "unloaded": describe(unloaded),
        "with_hanging": describe(loaded),
        "after_clients_left": describe(after),
        "ratio_median": statistics.median(loaded) / statistics.median(unloaded),
        "hanging_requests": args.in_flight,
        "answered_503_while_hanging": rejected,
    }


def classification(workdir: Path, args) -> dict:
    deployment = Deployment.load(_deployment_file(workdir))
    cases = {
        "digits": "1" * 1_000_000,
        "a": "a" * 1_000_000,
        "a_": "a_" * 500_000,
        "1/": "1/" * 500_000,
        "parens": "f(" * 500_000,
        "dollars": "1 " * 500_000,
        "normal 1 KB": (PROMPTS["code"].format(i=1) + " ") * 16,
    }
    out = {}
    for name, text in cases.items():
        request = body("code", 0)
        request["messages"][0]["content"] = text
        times = []
        for _ in range(5):
            t = time.perf_counter()
            deployment.route(request_text(request))
            times.append(time.perf_counter() - t)
        out[name] = 1e3 * statistics.median(times)
    return out


def _deployment_file(workdir: Path) -> Path:
    path = workdir / "classify.toml"
    path.write_text('engine = "llama.cpp"\n[fallback]\nurl = "http://127.0.0.1:9"\n')
    return path


def health_while_classifying(workdir: Path, args) -> dict:
    healthy = Served(backend(args.answer_ms / 1e3, hang=False))
    urls = dict.fromkeys(PROMPTS, healthy.url)
    gateway = Gateway(workdir, urls, [])
    try:
        big = body("math", 0)
        big["messages"][0]["content"] = "1" * 1_000_000
        thread = threading.Thread(
            target=lambda: httpx.post(gateway.url + "/v1/chat/completions", json=big, timeout=120)
        )
        t0 = time.perf_counter()
        thread.start()
        time.sleep(0.05)
        t = time.perf_counter()
        status = httpx.get(gateway.url + "/health", timeout=60).status_code
        health = time.perf_counter() - t
        thread.join()
        whole = time.perf_counter() - t0
    finally:
        gateway.stop()
    return {"health_ms": 1e3 * health, "health_status": status, "big_request_ms": 1e3 * whole}


def write_prompts(path: Path, ids: dict[str, tuple[str, int]]) -> None:
    with path.open("w") as f:
        for pid, (domain, i) in ids.items():
            f.write(
                json.dumps({"id": pid, "domain": domain, "prompt": PROMPTS[domain].format(i=i)})
                + "\n"
            )


def fire(
    url: str, ids: dict[str, tuple[str, int]], concurrency: int, answered: dict, stop_after=None
):
    async def main():
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(
            timeout=60, limits=httpx.Limits(max_connections=concurrency + 10)
        ) as client:

            async def one(n, pid, domain, i):
                async with sem:
                    try:
                        r = await client.post(
                            url + "/v1/chat/completions",
                            json=body(domain, i, stream=n % 3 == 0),
                            headers={"X-Prompt-Id": pid},
                        )
                        if r.status_code == 200:
                            answered[pid] = r.status_code
                    except httpx.HTTPError:
                        pass

            await asyncio.gather(
                *(one(n, pid, d, i) for n, (pid, (d, i)) in enumerate(ids.items()))
            )

    asyncio.run(main())


def read_ids(path: Path) -> tuple[set[str], int]:
    ids, torn = set(), 0
    if path.exists():
        for line in path.read_bytes().splitlines():
            try:
                ids.add(json.loads(line)["prompt_id"])
            except (ValueError, KeyError):
                torn += 1
    return ids, torn


def kill9(workdir: Path, args) -> dict:
    healthy = Served(backend(args.answer_ms / 1e3, hang=False))
    gateway = Gateway(workdir, dict.fromkeys(PROMPTS, healthy.url), [])
    domains = list(PROMPTS)
    ids = {f"k{n}": (domains[n % 4], n) for n in range(args.kill_requests)}
    answered: dict[str, int] = {}
    thread = threading.Thread(target=fire, args=(gateway.url, ids, 32, answered))
    thread.start()
    while len(answered) < args.kill_requests // 3:
        time.sleep(0.005)
    os.kill(gateway.process.pid, signal.SIGKILL)
    thread.join()
    gateway.process.wait()
    logged, torn = read_ids(gateway.log)
    errors, _ = read_ids(gateway.log.with_name("gateway.errors.jsonl"))
    missing = sorted(set(answered) - logged - errors)
    prompts = workdir / "prompts.jsonl"
    write_prompts(prompts, ids)
    ingest = subprocess.run(
        [
            "specscope",
            "ingest",
            str(gateway.log),
            "--format",
            "llama.cpp",
            "--prompts",
            str(prompts),
            "--out",
            str(workdir / "ingested"),
        ],
        capture_output=True,
        text=True,
    )
    return {
        "sent": args.kill_requests,
        "answered_200": len(answered),
        "in_request_log": len(logged),
        "in_errors_log": len(errors),
        "answered_but_in_no_log": len(missing),
        "torn_lines": torn,
        "ingest_exit": ingest.returncode,
        "ingest_stderr": ingest.stderr.strip()[-300:],
    }


def joins(workdir: Path, args) -> dict:
    healthy = Served(backend(args.answer_ms / 1e3, hang=False))
    # the four domains share one backend URL here: let all 200 be in flight at once
    gateway = Gateway(workdir, dict.fromkeys(PROMPTS, healthy.url), ["--max-in-flight", "256"])
    domains = list(PROMPTS)
    ids = {f"j{n}": (domains[n % 4], n) for n in range(200)}
    answered: dict[str, int] = {}
    try:
        fire(gateway.url, ids, 200, answered)
    finally:
        gateway.stop()
    prompts = workdir / "prompts.jsonl"
    write_prompts(prompts, ids)
    out = workdir / "joined"
    cmd = [
        "specscope",
        "ingest",
        str(gateway.log),
        "--format",
        "llama.cpp",
        "--prompts",
        str(prompts),
    ]
    by_id = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True)
    order = subprocess.run(
        [*cmd, "--out", str(workdir / "order"), "--join", "order"], capture_output=True, text=True
    )
    right = 0
    if by_id.returncode == 0:
        requests = pd.read_parquet(out / "requests.parquet")
        for row in requests.itertuples():
            domain, i = ids[row.prompt_id]
            expected = prompt_timings(PROMPTS[domain].format(i=i))
            right += int(
                row.domain == domain
                and row.accepted == expected["draft_n_accepted"]
                and row.steps == expected["draft_n_verif_steps"]
            )
    logged_order = [json.loads(x)["prompt_id"] for x in gateway.log.read_text().splitlines()]
    return {
        "answered": len(answered),
        "lines": len(logged_order),
        "lines_out_of_sent_order": sum(a != b for a, b in zip(logged_order, ids)),
        "joined_to_own_prompt": right,
        "ingest_exit": by_id.returncode,
        "join_order_exit": order.returncode,
        "join_order_message": order.stderr.strip()[-300:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument(
        "--requests", type=int, default=60, help="sequential chat requests per latency figure"
    )
    parser.add_argument("--answer-ms", type=float, default=5.0)
    parser.add_argument("--kill-requests", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, step in (
            ("classification_ms", classification),
            ("health_while_classifying", health_while_classifying),
            ("isolation", isolation),
            ("kill9", kill9),
            ("joins", joins),
        ):
            workdir = Path(tmp) / name
            workdir.mkdir()
            results[name] = step(workdir, args)
            print(name, json.dumps(results[name], indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
