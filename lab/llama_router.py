"""llama-server in router mode as a per-domain deployment, and llama-server's draft counters
replayed for a model-free drafter.

- :func:`preset_section`: one preset of a router-mode presets file over the target GGUF, the
  exact flags of a :class:`~specscope.serving.llamacpp.server.ServerSetting` (the file itself:
  :func:`specscope.serving.llamacpp.export.presets_ini`, which ``specscope export`` writes).
- :class:`LlamaRouter`: that llama-server process (no model of its own: it starts one child
  server per preset when a request names it in ``model``), started and stopped as
  :class:`~specscope.serving.llamacpp.server.LlamaServer` is.
- :func:`lookup_chain_counts`: what chain speculation by a model-free drafter (llama.cpp's
  ngram-simple as :mod:`specscope.drafters.llama_ngram` re-writes it) does along a request's own
  output, step by step as llama-server does it: the draft and acceptance counters llama-server
  reports, recomputed from the prompt and output tokens alone (``scripts/llamacpp_ngram_counters.py``
  and tests/serving/test_llamaserver.py compare them with llama-server's own).

It does not route requests (:mod:`specscope.serving.gateway`) or build llama.cpp
(:mod:`specscope.serving.llamacpp.programs`). No ``specscope`` command uses it: the tests, the
gateway's benchmark and ``scripts/llamacpp_ngram_counters.py`` do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specscope.drafters import Lookup
from specscope.serving.llamacpp.server import LlamaServer, ServerSetting


def preset_section(target: str | Path, setting: ServerSetting, draft: str | Path | None) -> dict:
    """One preset: the target model and the setting's flags (``-md`` when it speculates)."""
    flags = setting.flags(draft if setting.uses_draft_model else None)
    return {
        "model": str(target),
        **{flags[i].lstrip("-"): flags[i + 1] for i in range(0, len(flags), 2)},
    }


@dataclass(eq=False)
class LlamaRouter(LlamaServer):
    """llama-server in router mode over a presets file (``model`` here is that file)."""

    models_max: int = 4  # presets loaded at once (llama-server's default)

    @property
    def argv(self) -> list[str]:
        return [
            str(self.tools.server),
            "--models-preset",
            str(self.model),
            "--models-max",
            str(self.models_max),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]


GREEDY = {"temperature": 0.0, "top_k": 1, "samplers": ["top_k"], "seed": 0}


@dataclass(frozen=True)
class ChainCounts:
    """What greedy chain speculation did on one request, in llama-server's terms."""

    generated: int  # predicted_n
    drafted: int  # draft_n
    accepted: int  # draft_n_accepted
    steps: int  # verify steps

    @property
    def tokens_per_step(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else float("nan")


def lookup_chain_counts(
    prompt: Sequence[int],
    output: Sequence[int],
    lookup: Lookup,
    k: int,
    n_predict: int | None = None,
) -> ChainCounts:
    """What llama-server's lookup speculation (``lookup``: context -> at most ``k`` drafts) did
    on a greedy request whose ``output`` followed ``prompt``: the prompt's pass emits the first
    token; each later step drafts from the context so far, capped at the tokens left before
    ``n_predict`` (default: the output's length) minus one (tools/server/server-context.cpp,
    ``get_n_draft_max``), and accepts the drafts that equal the output's next tokens."""
    output = [int(t) for t in output]
    n = len(output)
    limit = n if n_predict is None else n_predict
    context = [int(t) for t in prompt] + output[:1]
    t, drafted, accepted, steps = min(n, 1), 0, 0, 0
    while t < n:
        width = limit - t - 1
        draft = lookup(context, k)[:width] if width > 0 else []
        run = 0
        while run < len(draft) and t + run < n and draft[run] == output[t + run]:
            run += 1
        drafted += len(draft)
        accepted += run
        steps += 1
        context += output[t : t + run + 1]
        t += run + 1
    return ChainCounts(n, drafted, accepted, steps)
