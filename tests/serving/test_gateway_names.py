"""The gateway under the field's names: ``/metrics`` read by Prometheus' own text parser
(``specscope_gateway_*``, vLLM's ``vllm:*`` only where the deployment asks), and ``/v1/models``
read by the OpenAI SDK, each against a real gateway on loopback."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
parser = pytest.importorskip("prometheus_client.parser")
openai = pytest.importorskip("openai")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from test_gateway import Served  # an ASGI app on a free local port, in a thread
from typer.testing import CliRunner

import specscope.serving.gateway as gw
from specscope.cli import app
from specscope.serving.gateway import Backend, Deployment, GatewayLimits, make_app
from specscope.serving.gateway.metrics import PREFIX, VLLM_NAMES

CODE = "Write a python function that returns the sum of a list."
CHAT = "Describe a quiet morning in a small harbour town."
TIMINGS = {"predicted_n": 10, "draft_n": 9, "draft_n_accepted": 6, "prompt_n": 12}


def fake_engine(models: list[dict] | None) -> Starlette:
    """llama-server's shapes: a chat answer with ``timings``, and ``GET /v1/models`` listing
    ``models`` (None: no such route, a 404)."""

    async def chat(request: Request):
        body = await request.json()
        return JSONResponse(
            {
                "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                "model": body.get("model"),
                "timings": TIMINGS,
                "usage": {"prompt_tokens": 12},
            }
        )

    async def listing(request: Request):
        return JSONResponse({"object": "list", "data": models})

    routes = [Route("/v1/chat/completions", chat, methods=["POST"])]
    if models is not None:
        routes.append(Route("/v1/models", listing, methods=["GET"]))
    return Starlette(routes=routes)


@pytest.fixture()
def served():
    """``serve(asgi) -> Served``; everything served is stopped after the test."""
    started = []

    def serve(asgi) -> Served:
        started.append(Served(asgi))
        return started[-1]

    yield serve
    for s in reversed(started):
        s.stop()


def families(url: str) -> dict:
    """``/metrics`` as Prometheus' text parser reads it: family name -> family."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def value(fams: dict, family: str, sample: str, **labels) -> float:
    (found,) = [s.value for s in fams[family].samples if s.name == sample and s.labels == labels]
    return found


def deployment_file(tmp_path, engine_url: str, extra: str = ""):
    path = tmp_path / "deployment.toml"
    path.write_text(
        f'engine = "llama.cpp"\n{extra}[domains.code]\nurl = "{engine_url}"\nmodel = "code"\n'
        f'[fallback]\nurl = "{engine_url}"\nmodel = "plain"\n'
    )
    return path


def test_metrics_are_specscope_names_and_no_vllm_names_unless_asked(tmp_path, served):
    engine = served(fake_engine([]))
    plan = Deployment.load(deployment_file(tmp_path, engine.url))
    assert plan.vllm_compatible_metrics is False
    gateway = served(make_app(plan, tmp_path / "gateway.jsonl"))
    for text in (CODE, CHAT):
        body = {"messages": [{"role": "user", "content": text}]}
        httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
    fams = families(gateway.url)
    assert all(name.startswith(PREFIX) for name in fams), sorted(fams)
    assert not any(":" in name for name in fams)
    accepted = TIMINGS["draft_n_accepted"]
    steps = TIMINGS["predicted_n"] - 1 - accepted  # llama-server logs no steps: derived
    counts = {
        "requests": 1,
        "verify_steps": steps,
        "accepted_tokens": accepted,
        "draft_tokens": TIMINGS["draft_n"],
        "generation_tokens": TIMINGS["predicted_n"],
        "prompt_tokens": 12,
    }
    for key, count in counts.items():
        assert fams[PREFIX + key].type == "counter"
        assert value(fams, PREFIX + key, PREFIX + key + "_total", domain="code") == count
    latency = PREFIX + "request_latency_seconds"
    assert fams[latency].type == "histogram"
    assert value(fams, latency, latency + "_count", domain="chat") == 1
    assert fams[PREFIX + "request_errors"].type == "counter"
    for gauge in ("tokens_per_step", "predicted_tokens_per_step", "drift"):
        assert fams[PREFIX + gauge].type == "gauge"
    served_tau = value(
        fams, PREFIX + "tokens_per_step", PREFIX + "tokens_per_step", domain="code", bound="mid"
    )
    assert served_tau == pytest.approx((steps + accepted) / steps)


def test_the_deployment_file_asks_for_vllm_names_and_they_count_the_same(tmp_path, served):
    engine = served(fake_engine([]))
    path = deployment_file(tmp_path, engine.url, "vllm_compatible_metrics = true\n")
    plan = Deployment.load(path)
    assert plan.vllm_compatible_metrics is True
    gateway = served(make_app(plan, tmp_path / "gateway.jsonl"))
    for _ in range(2):
        body = {"messages": [{"role": "user", "content": CODE}]}
        httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
    fams = families(gateway.url)
    # prometheus_client writes each counter's and histogram's start time as NAME_created
    vllm = {name.removesuffix("_created") for name in fams if name.startswith("vllm:")}
    assert vllm == set(VLLM_NAMES.values())
    for key, name in VLLM_NAMES.items():
        assert fams[name].type == fams[PREFIX + key].type
        own = {
            (s.name.removeprefix(PREFIX + key), tuple(sorted(s.labels.items())), s.value)
            for s in fams[PREFIX + key].samples
            if not s.name.endswith("_created")
        }
        twin = {
            (s.name.removeprefix(name), tuple(sorted(s.labels.items())), s.value)
            for s in fams[name].samples
            if not s.name.endswith("_created")
        }
        assert own == twin, key
    assert value(
        fams, "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_drafts_total", domain="code"
    ) == 2 * (TIMINGS["predicted_n"] - 1 - TIMINGS["draft_n_accepted"])
    # the gateway's own series stay under its own names only
    assert not any(n.startswith("vllm:") and "drift" in n for n in fams)


def test_the_cli_flag_asks_for_vllm_names(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(gw, "serve", lambda plan, *a, **k: seen.append(plan))
    path = deployment_file(tmp_path, "http://127.0.0.1:9")
    log = str(tmp_path / "g.jsonl")
    for flags, expected in (([], False), (["--vllm-compatible-metrics"], True)):
        result = CliRunner().invoke(app, ["gateway", str(path), "--log", log, *flags])
        assert result.exit_code == 0, result.output
        assert seen[-1].vllm_compatible_metrics is expected


def silent_backend():
    """A listening socket that never accepts: connections complete, nothing is ever answered."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_v1_models_read_by_the_openai_sdk_merges_the_backends_and_never_hangs(tmp_path, served):
    vllm_a = served(
        fake_engine([{"id": "qwen", "object": "model", "created": 7, "owned_by": "vllm"}])
    )
    # the same model on a second server, one more, and an entry without an id (skipped)
    vllm_b = served(fake_engine([{"id": "qwen", "created": 9}, {"id": "qwen-big"}, {"x": 1}]))
    no_route = served(fake_engine(None))  # answers 404
    silent, silent_url = silent_backend()
    down = closed_port_url()
    deployment = Deployment(
        "vllm",
        {
            "code": Backend(vllm_a.url),
            "math": Backend(vllm_b.url),
            "reasoning": Backend(no_route.url, "preset-r"),  # the deployment sets this model
            "chat": Backend(silent_url),
        },
        Backend(down),
    )
    limits = GatewayLimits(connect_timeout=0.5)
    gateway = served(make_app(deployment, tmp_path / "gateway.jsonl", limits=limits))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    try:
        started = time.monotonic()
        page = client.models.with_raw_response.list()
        took = time.monotonic() - started
        models = page.parse()
        assert [m.id for m in models.data] == ["qwen", "qwen-big", "preset-r"]
        assert all(m.object == "model" for m in models.data)
        first = models.data[0]
        assert (first.created, first.owned_by) == (7, "vllm")  # the first backend's entry
        assert models.data[2].owned_by == "specscope-gateway (vllm)"
        assert took < 5, took  # the silent backend is given up after connect_timeout
        unlisted = page.headers["x-specscope-unlisted"].split(", ")
        assert sorted(unlisted) == sorted([no_route.url, silent_url, down])
    finally:
        silent.close()
    # no model known at all: a 502 the SDK raises, not an empty list
    hidden = closed_port_url().replace("http://", "http://user:secret@")
    nothing = Deployment("vllm", {}, Backend(hidden))
    gateway = served(make_app(nothing, tmp_path / "g2.jsonl", limits=limits))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        client.models.list()
    assert e.value.status_code == 502 and "did not answer" in str(e.value)
    assert e.value.response.headers["x-specscope-unlisted"].startswith("http://***@127.0.0.1:")
    assert "secret" not in str(e.value) and "secret" not in e.value.response.text


def test_v1_models_of_a_router_mode_deployment_lists_its_presets(tmp_path, served):
    # llama-server in router mode lists its presets itself; the deployment's are the same names
    engine = served(fake_engine([{"id": "code", "object": "model"}, {"id": "plain"}]))
    plan = Deployment.load(deployment_file(tmp_path, engine.url))
    gateway = served(make_app(plan, tmp_path / "gateway.jsonl"))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    page = client.models.with_raw_response.list()
    assert [m.id for m in page.parse().data] == ["code", "plain"]
    assert "x-specscope-unlisted" not in page.headers
