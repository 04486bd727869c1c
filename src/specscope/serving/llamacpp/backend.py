"""llama-server as a bench backend (:class:`~specscope.tune.backends.Backend`): every setting a
server of its own, spawned and stopped as :mod:`.server` does, every repeat on fresh servers;
``specscope bench --backend llama-server`` and ``specscope llamacpp``'s tuning time it through the
one loop, :func:`specscope.tune.bench.run_bench`.

How a request is timed. Greedy, ``cache_prompt`` off (every request starts cold), the server's own
``timings``: ``prompt_ms`` (the prefill and the first token) and ``predicted_ms`` (the tokens
after it), so that a request's ``first_token_s`` is the prefill and ``time_s - first_token_s``
the decoding speculation changes. Steps: the prefill's token is one step, and every later step
emits its accepted drafts and one token, so steps = ``predicted_n - draft_n_accepted``; tokens
per step are counted as specscope's decoder counts them.

Every repeat starts every server afresh: ``ngram-mod`` keeps its n-gram pool across requests
(a prompt sent twice to one server drafts its own earlier output the second time: 54 of 54
drafts accepted at 3.5x the first time's speed on this project's CPU), so a repeat on a warm
server would time another thing than the first.

It does not choose (:mod:`specscope.tune.engine_choice`), loop over prompts or summarise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ...tune.backends import Decoded, Request, Runner
from .programs import LlamaTools
from .server import Completion, LlamaServer, ServerSetting

PLAIN = "plain"

# what `specscope llamacpp` tunes over when no --candidate is given: plain, the draft model at
# K = 2 and at K = 4 stopped by its own confidence (--spec-draft-p-min 0.75: the draft's
# probability is the best signal of a node's acceptance the records hold), and every model-free
# lookup at llama.cpp's sizes (ngram-cache, which drafts from a corpus file specscope does not
# make, aside)
DEFAULT_CANDIDATES = (
    "plain",
    # llama.cpp's --poll 0 (threads sleep between passes): on 2 CPUs plain decoded 1.11x plain
    # at the default poll 50, and a lookup's gain there was mostly this (BENCHMARKS.md)
    "plain:poll=0",
    "draft-simple:k=2",
    "draft-simple:k=4,p_min=0.75",
    "ngram-simple",
    "ngram-map-k",
    "ngram-mod",
    "ngram-map-k:poll=0",
)


def candidate_settings(texts: Sequence[str], base: ServerSetting) -> dict[str, ServerSetting]:
    """Candidate name (as written) -> setting; ``plain`` is always one (the reference)."""
    texts = list(dict.fromkeys([PLAIN, *texts]))
    return {t: ServerSetting.parse(t, base) for t in texts}


def decoded(c: Completion) -> Decoded:
    """A /completion answer as the bench counts it (module docstring)."""
    return Decoded(
        tuple(c.tokens),
        max(c.predicted_n - c.draft_n_accepted, 0),
        c.draft_n,
        c.draft_n_accepted,
        (c.prompt_ms + c.predicted_ms) / 1000,
        c.prompt_ms / 1000,
        stop_type=c.stop_type,
    )


@dataclass
class LlamaServerBackend:
    """llama-server of ``target`` (and ``draft`` for a draft-model setting), ``n_predict`` tokens
    a request. ``serve(setting)``: starts one server whose ``complete(ids, n_predict)`` answers a
    :class:`Completion` (default: a :class:`LlamaServer`; tests give a fake)."""

    tools: LlamaTools | None
    target: Path | None
    draft: Path | None
    n_predict: int
    serve: Callable[[ServerSetting], AbstractContextManager] | None = None
    name: str = "llama-server"
    fresh_per_repeat: bool = True
    adaptive: ServerSetting | None = None  # --spec-draft-p-min is a setting, not a default

    def _serve(self, s: ServerSetting) -> AbstractContextManager:
        if self.serve is not None:
            return self.serve(s)
        return LlamaServer(self.tools, self.target, s, self.draft if s.uses_draft_model else None)

    @contextmanager
    def session(self, settings: Mapping[str, ServerSetting]) -> Iterator[Runner]:
        with ExitStack() as stack:
            servers = {n: stack.enter_context(self._serve(s)) for n, s in settings.items()}
            yield lambda name, p: decoded(servers[name].complete(list(p.ids), self.n_predict))


# a requests.parquet written before the bench's requests were one type: its columns renamed
LEGACY_COLUMNS = {"candidate": "method", "draft_n": "drafted"}


def requests_from_frame(frame: pd.DataFrame) -> list[Request]:
    """The requests of a ``requests.parquet`` back; one of the llama-server bench before
    :class:`Request` (``prompt_s`` and ``decode_s``) is read as the request it was."""
    frame = frame.rename(columns=LEGACY_COLUMNS)
    if "prompt_s" in frame.columns:
        frame = frame.assign(
            time_s=frame["prompt_s"] + frame["decode_s"],
            first_token_s=frame["prompt_s"],
            steps=(frame["tokens"] - frame["accepted"]).clip(lower=0),
        )
    return [Request.from_dict(row) for row in frame.to_dict("records")]
