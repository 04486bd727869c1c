"""llama-server end to end, on this CPU: the demo pair's GGUF files behind llama-server's router
mode (one preset per domain) behind specscope gateway.

Held-out prompts of every domain go through the gateway; the test checks that each reached its
domain's preset (the log names it; the server's timings show drafting only where the preset
speculates, at most K per verify step), that every output equals the plain preset's greedy output
token for token, that the draft counts are exactly what greedy chains of K give on the draft's
agreement with those outputs (llamarouter.chain_counts), and that specscope ingest of the
gateway's log gives per-domain tokens per step inside the interval that a measurement on other
prompts predicts for the same K.

Cost: about 2 minutes of 2 CPU cores once llama-server is built (the first run builds it from
the llama-cpp-python sdist: cmake and a C++ compiler, many minutes; the build is cached).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from specscope.gateway import Backend, Deployment, make_app  # noqa: E402
from specscope.llamarouter import (GREEDY, LlamaRouter, chain_acceptance, chain_counts,  # noqa: E402
                                   draft_agreement, preset_section, presets_ini)
from specscope.llamaserver import (LlamaToolsError, ServerSetting, build_llama_tools,  # noqa: E402
                                   find_llama_tools)
from specscope.tune.router import RuleRouter, prompt_text  # noqa: E402

pytestmark = pytest.mark.slow

N_PREDICT = 16
PER_DOMAIN = 2  # held-out prompts per domain (and as many measured, for drafting domains)
KS = {"code": 3, "math": 2}  # the presets that speculate; reasoning and chat decode plainly
DOMAINS = ("code", "math", "reasoning", "chat")


def _tools():
    try:
        tools = find_llama_tools()
    except LlamaToolsError as e:
        pytest.skip(str(e))
    if tools is not None:
        return tools
    if shutil.which("cmake") is None or not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("llama-server is not built and cmake or a C++ compiler is missing to build it "
                    "(or set SPECSCOPE_LLAMA_BIN to a directory of built llama.cpp programs)")
    try:
        return build_llama_tools(echo=lambda line: None)
    except LlamaToolsError as e:
        pytest.skip(f"llama-server could not be built here: {e}")


def _demo_pair():
    from specscope.models.config import ModelLoadError
    from specscope.models.demo import demo_gguf

    try:
        return demo_gguf("target"), demo_gguf("draft")
    except ModelLoadError as e:
        pytest.skip(f"the demo pair is not installed: {e}")


def _prompts():
    from specscope.prompts.domains import select_prompts
    from specscope.prompts.items import PromptSourceError

    try:
        items = select_prompts(list(DOMAINS), 2 * PER_DOMAIN, seed=2026)
    except (PromptSourceError, ImportError) as e:
        pytest.skip(f"offline prompt sources are missing (pip install 'specscope[domains]'): {e}")
    measured = [it for d in KS for it in [x for x in items if x.domain == d][PER_DOMAIN:]]
    held_out = [it for d in DOMAINS for it in [x for x in items if x.domain == d][:PER_DOMAIN]]
    return measured, held_out


class Served:
    def __init__(self, asgi):
        self.server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=0,
                                                    log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tools = _tools()
    target, draft = _demo_pair()
    measured, held_out = _prompts()
    tmp = tmp_path_factory.mktemp("llama-router")
    base = ServerSetting(threads=2, poll=0, draft_poll=0, ctx=1024)
    sections = {name: preset_section(target, base.with_k(k), draft) for name, k in KS.items()}
    sections["plain"] = preset_section(target, base, None)
    sections["draft"] = preset_section(draft, base, None)  # the draft alone: its greedy tokens
    presets = tmp / "presets.ini"
    presets.write_text(presets_ini(sections))
    router = LlamaRouter(tools, presets, base, log=tmp / "llama-server.log", models_max=4)
    with router:
        plan = Deployment("llama.cpp", {d: Backend(router.url, d) for d in KS},
                          Backend(router.url, "plain"))
        gateway = Served(make_app(plan, tmp / "gateway.jsonl"))
        try:
            yield router, gateway.url, tmp, measured, held_out
        finally:
            gateway.stop()


def _tokens(router, text):
    return router.post("/tokenize", {"model": "plain", "content": text})["tokens"]


def _plain(router, prompt_tokens):
    answer = router.post("/completion", {"model": "plain", "prompt": prompt_tokens,
                                         "n_predict": N_PREDICT, "return_tokens": True,
                                         "cache_prompt": False, **GREEDY})
    return answer["tokens"]


def test_llama_server_router_behind_the_gateway(deployment):
    from specscope.ingest import ingest

    router, url, tmp, measured, held_out = deployment
    domain_of = RuleRouter().classify

    # 1. held-out prompts of every domain through the gateway (/completion, greedy)
    answers = {}
    for item in held_out:
        answer = httpx.post(url + "/completion", timeout=600, headers={"X-Prompt-Id": item.id},
                            json={"prompt": prompt_text(item), "n_predict": N_PREDICT,
                                  "return_tokens": True, "cache_prompt": False, **GREEDY})
        assert answer.status_code == 200, answer.text
        answers[item.id] = answer.json()
    lines = {x["prompt_id"]: x for x in map(json.loads, (tmp / "gateway.jsonl").read_text().splitlines())}
    assert set(lines) == {it.id for it in held_out}

    counts, agreements = {}, {}
    for item in held_out:
        line, routed = lines[item.id], domain_of(prompt_text(item))
        preset = routed if routed in KS else "plain"
        timings = line["response"]["timings"]
        # each request reached its domain's preset, and drafted only there, at most K a step
        assert (line["domain"], line["model"]) == (routed, preset)
        if preset == "plain":
            assert "draft_n" not in timings
        else:
            assert 0 < timings["draft_n"] <= KS[preset] * (timings["predicted_n"] - 1)
        # 2. the output equals the plain preset's greedy output, token for token
        prompt_tokens = _tokens(router, prompt_text(item))
        assert timings["prompt_n"] == len(prompt_tokens)
        plain = _plain(router, prompt_tokens)
        assert line["response"]["tokens"] == plain, f"{item.id}: speculation changed the output"
        # 3. the draft counts are exactly greedy chains of K over the draft's agreement
        if preset != "plain":
            agreements[item.id] = draft_agreement(router, "draft", prompt_tokens, plain)
            counts[item.id] = chain_counts(agreements[item.id], KS[preset])
            assert (timings["predicted_n"], timings["draft_n"], timings["draft_n_accepted"]) == (
                counts[item.id].generated, counts[item.id].drafted, counts[item.id].accepted), item.id

    # 4. ingest of the gateway's log (the drafting presets: main's ingest still refuses timings
    #    without draft_n) against the prediction of a measurement on other prompts
    drafted_log = tmp / "drafted.jsonl"
    drafted_log.write_text("".join(json.dumps(lines[p]) + "\n" for p in counts))
    prompts_file = tmp / "prompts.jsonl"
    prompts_file.write_text("".join(
        json.dumps({"id": it.id, "domain": domain_of(prompt_text(it)),
                    "prompt": prompt_text(it)}) + "\n" for it in held_out))
    ingest(drafted_log, "llama.cpp", prompts_file, tmp / "ingested")
    import pandas as pd
    requests = pd.read_parquet(tmp / "ingested" / "requests.parquet")

    measure = {}
    for item in measured:
        tokens = _tokens(router, prompt_text(item))
        measure[item.id] = draft_agreement(router, "draft", tokens, _plain(router, tokens))
    acceptance = chain_acceptance(measure, {it.id: it.domain for it in measured}, max(KS.values()))
    rng = np.random.default_rng(0)
    for domain, k in KS.items():
        seen = requests[requests["domain"] == domain]
        if seen.empty:
            continue
        tokens_per_step = (seen["accepted"].sum() + seen["steps"].sum()) / seen["steps"].sum()
        sub = acceptance.subset(domain)
        weights = rng.multinomial(len(sub.prompts), np.full(len(sub.prompts), 1 / len(sub.prompts)),
                                  size=1000)
        low, high = np.quantile(sub.tau(k, weights), [0.025, 0.975])
        predicted = float(sub.tau(k)[0])
        print(f"{domain} K={k}: tokens/step seen {tokens_per_step:.2f} over {len(seen)} requests, "
              f"predicted {predicted:.2f} [{low:.2f}, {high:.2f}]")
        # the measured figure, with the held-out prompts' own sampling error, meets the interval
        own = [counts[p].tokens_per_step for p in seen["prompt_id"]]
        assert min(own) <= high + 1e-9 and max(own) >= low - 1e-9 or low <= tokens_per_step <= high
    assert os.path.exists(tmp / "ingested" / "manifest.json")
