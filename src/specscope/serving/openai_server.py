"""An OpenAI-compatible server the user already runs (vLLM, SGLang or llama-server) as a bench
backend (:class:`~specscope.tune.backends.Backend`): ``specscope bench --backend openai --url
NAME=URL``, one setting per URL (``plain`` the reference).

Per request, one at a time: the held-out prompt, greedy (temperature 0), ``max_tokens`` new
tokens; ``/v1/completions`` with the prompt's token ids as the pair's tokenizer renders them, or
``/v1/chat/completions`` with its messages where the rendering is ``chat`` (the server's chat
template then renders them). The speculative counts of a request are read from the answer where
the engine returns them (the parsers of ``specscope ingest``: llama-server's ``timings``
``draft_n``/``draft_n_accepted``, vLLM's ``metrics.speculative_decoding``, SGLang's
``meta_info``); where it does not, from the engine's Prometheus counters (``/metrics``: vLLM's
``vllm:spec_decode_num_draft_tokens`` and ``vllm:spec_decode_num_accepted_tokens``, whose names
:data:`specscope.serving.gateway.metrics.VLLM_NAMES` checks against vLLM's source) read before
and after the request. Steps: the prefill's token one, every later step its accepted drafts and
one token (``completion_tokens - accepted``), as every other backend counts them.

Times: the engine's own where it gives them (llama-server's ``prompt_ms`` and ``predicted_ms``),
else the request's round trip with no prefill apart (``first_token_s`` 0). Output ids: the
answer's (vLLM's ``token_ids``) or the text re-tokenized by the pair's tokenizer.

It starts nothing, and needs the ``gateway`` extra (httpx, prometheus-client).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecscopeError
from ..tune.backends import Decoded, Prompt, Runner
from ..tune.study import BenchPlan
from .ingest.formats import FORMATS
from .request_stats import IngestError

# the engines whose answers carry per-request counts, by the key of their statistics
ANSWER_FORMATS = ("llama.cpp", "vllm", "sglang")
# vLLM's Prometheus counters of speculative decoding (vllm/v1/spec_decode/metrics.py @016a8587,
# as serving/gateway/metrics.py records them); a counter's samples end in _total
DRAFTED_COUNTER = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_COUNTER = "vllm:spec_decode_num_accepted_tokens"


class ServerError(SpecscopeError):
    """A server that did not answer as an OpenAI-compatible one does; the message says which."""


@dataclass(frozen=True)
class ServerURL:
    """One setting of this backend: a server at ``url`` serving ``model`` (None: the server's
    only model), its chat endpoint used where ``chat``."""

    url: str
    model: str | None = None
    chat: bool = False

    @classmethod
    def parse(cls, text: str, chat: bool = False) -> tuple[str, ServerURL]:
        """``NAME=URL`` (or a bare URL, named ``server``) -> (name, setting)."""
        name, _, url = text.rpartition("=") if "=" in text.split("://")[0] else ("", "", text)
        return name or "server", cls(url.rstrip("/"), chat=chat)


@dataclass(frozen=True)
class Counts:
    """A request's speculative counts, and where they were read."""

    drafted: int | None
    accepted: int | None
    source: str


def answer_counts(answer: dict) -> Counts | None:
    """The counts an answer carries (the first engine format whose statistics key it holds);
    None where it carries none."""
    for name in ANSWER_FORMATS:
        fmt = FORMATS[name]
        if answer.get(fmt.stats_key) is None:
            continue
        try:
            stats = fmt.parse(answer, "the answer")
        except IngestError:
            continue  # e.g. vLLM's metrics without speculative_decoding
        return Counts(stats.drafted, stats.accepted, f"{fmt.engine} answer ({fmt.stats_key})")
    return None


def prometheus_counts(text: str) -> tuple[float, float] | None:
    """vLLM's drafted and accepted token counters in a ``/metrics`` exposition, summed over
    their labels; None where it has neither."""
    from prometheus_client.parser import text_string_to_metric_families

    sums = {DRAFTED_COUNTER: 0.0, ACCEPTED_COUNTER: 0.0}
    found = False
    for family in text_string_to_metric_families(text):
        if family.name in sums:
            found = True
            sums[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return (sums[DRAFTED_COUNTER], sums[ACCEPTED_COUNTER]) if found else None


@dataclass
class OpenAIBackend:
    """OpenAI-compatible servers at URLs (module docstring). ``tokenize``: the pair's tokenizer,
    for output ids an answer does not carry."""

    max_tokens: int
    tokenize: Callable[[str], list[int]]
    timeout_s: float = 600.0
    name: str = "openai"
    fresh_per_repeat: bool = False
    adaptive: ServerURL | None = None  # the server's own mode is whatever it was started with

    @contextmanager
    def session(self, settings: Mapping[str, ServerURL]) -> Iterator[Runner]:
        import httpx

        with httpx.Client(timeout=self.timeout_s) as client:
            yield lambda name, prompt: self.run(client, settings[name], prompt)

    def body(self, s: ServerURL, prompt: Prompt) -> dict:
        body = {"max_tokens": self.max_tokens, "temperature": 0.0, "top_p": 1.0, "n": 1,
                "stream": False, "seed": 0, "cache_prompt": False, "return_token_ids": True}  # fmt: skip
        if s.model:
            body["model"] = s.model
        if s.chat:
            return {**body, "messages": [dict(m) for m in prompt.item.messages]}
        return {**body, "prompt": list(prompt.ids)}

    def run(self, client, s: ServerURL, prompt: Prompt) -> Decoded:
        before = self._counters(client, s)
        path = "/v1/chat/completions" if s.chat else "/v1/completions"
        t0 = time.perf_counter()
        response = client.post(s.url + path, json=self.body(s, prompt))
        wall = time.perf_counter() - t0
        if response.status_code != 200:
            raise ServerError(
                f"{s.url}{path} answered {response.status_code}: {response.text[:300]}"
            )
        answer = response.json()
        counts = answer_counts(answer)
        if counts is None and before is not None:
            after = self._counters(client, s)
            counts = Counts(int(after[0] - before[0]), int(after[1] - before[1]), "/metrics")
        return decoded_answer(answer, counts, wall, self.tokenize)

    @staticmethod
    def _counters(client, s: ServerURL) -> tuple[float, float] | None:
        response = client.get(s.url + "/metrics")
        return prometheus_counts(response.text) if response.status_code == 200 else None


def decoded_answer(
    answer: dict, counts: Counts | None, wall_s: float, tokenize: Callable[[str], list[int]]
) -> Decoded:
    """An OpenAI-compatible answer as the bench counts it (module docstring)."""
    choice = (answer.get("choices") or [{}])[0]
    text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
    ids = choice.get("token_ids") or tokenize(text or "")
    generated = int((answer.get("usage") or {}).get("completion_tokens") or len(ids))
    accepted = counts.accepted if counts else None
    timings = answer.get("timings") or {}
    if "prompt_ms" in timings and "predicted_ms" in timings:
        first = timings["prompt_ms"] / 1000
        total = first + timings["predicted_ms"] / 1000
    else:
        first, total = 0.0, wall_s
    return Decoded(
        tuple(int(t) for t in ids),
        max(generated - (accepted or 0), 0),
        counts.drafted if counts else None,
        accepted,
        total,
        first,
        stop_type=str(choice.get("finish_reason") or ""),
    )


def openai_plan(
    urls: Sequence[str],
    policy_path: Path | None,
    domains: Sequence[str],
    per_domain: int,
    max_tokens: int,
    repeats: int,
    seed: int,
    in_sample: bool = False,
    target: str | None = None,
) -> BenchPlan:
    """The bench of servers already running, one setting per ``NAME=URL`` (one named ``plain``
    the reference), for :func:`specscope.tune.study.bench`: held-out prompts rendered by the
    pair's tokenizer (``target``; default the demo pair's) as the policy was tuned."""
    from ..models import load_tokenizer
    from ..tune.bench import Loop, bench_prompts, rendered_prompts
    from ..tune.policy import PolicyFile

    policy = PolicyFile.load(policy_path) if policy_path else None
    rendering = ((policy.info.get("tune") or {}) if policy else {}).get("rendering", "task")
    settings = dict(ServerURL.parse(u, chat=rendering == "chat") for u in urls)
    if "plain" not in settings:
        raise ServerError(
            "--backend openai needs a --url named plain (plain=URL): the speed-ups are over it"
        )
    chosen = bench_prompts(list(domains), per_domain, seed, policy, "rules", in_sample, split=False)
    tokenizer = load_tokenizer(target or "demo:target")
    backend = OpenAIBackend(
        max_tokens, lambda text: tokenizer.encode(text, add_special_tokens=False)
    )
    return BenchPlan(
        backend,
        settings,
        rendered_prompts(chosen.items, tokenizer, rendering, 512),
        chosen,
        Loop(repeats, 0, chosen.held_out_rule),
        f"servers at URLs, {max_tokens} new tokens",
        head={"backend": "openai", "urls": {n: s.url for n, s in settings.items()}},
        keep="requests",
    )
