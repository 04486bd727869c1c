"""llama-server in router mode as a per-domain deployment, and what greedy chains predict for it.

- :func:`presets_ini`: a router-mode presets file (``llama-server --models-preset FILE``), one
  section per preset over the same target GGUF, each section the exact flags of a
  :class:`~specscope.serving.llamacpp.server.ServerSetting` (keys are flag names without dashes, as
  llama.cpp's common/preset.cpp reads them; short forms such as ``t`` or ``md`` are allowed there).
- :class:`LlamaRouter`: that llama-server process (no model of its own: it starts one child
  server per preset when a request names it in ``model``), started and stopped as
  :class:`~specscope.serving.llamacpp.server.LlamaServer` is.
- :func:`draft_agreement`: at each position of the target's greedy output, whether the draft's
  greedy token equals the target's (asked of a plain preset serving the draft model, one request
  per disagreement).
- :func:`chain_counts`: what greedy chain speculation of K tokens does on such an output, step by
  step as llama-server does it (K drafts, capped at the tokens left minus one; accepted drafts
  plus the target's token per verify step).
- :func:`lookup_chain_counts`: the same for a model-free drafter (llama.cpp's ngram-simple as
  :mod:`specscope.drafters.llama_ngram` re-writes it) along a request's own output: the draft and
  acceptance counters llama-server reports, recomputed from the prompt and output tokens alone.
- :func:`chain_predictions`: tokens per step of chains of K per domain, from agreements measured
  on other prompts, by the one predictor ``tune`` uses (:class:`~specscope.tune.predict.Predictor`):
  replayed as greedy decoding (:func:`~specscope.analysis.replay.top_chain`) for every K the
  measured window holds, with a prompt-resampled interval; from the acceptance vector, flat past
  the window and labelled extrapolated, beyond it. Steps are counted as llama-server runs them
  and as specscope's decoder counts them: the prompt's pass emits the first token and counts as
  one step (``prefill_drafts=False``), so tokens per step is output tokens over verify steps + 1.

It does not route requests (:mod:`specscope.serving.gateway`) or build llama.cpp
(:mod:`specscope.serving.llamacpp.programs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...analysis.replay import ReplayRecords
from ...drafters import Lookup
from ...trees import TreeShape
from ...tune.acceptance import chain_acceptance
from ...tune.predict import Prediction, Predictor
from .programs import LlamaToolsError
from .server import LlamaServer, ServerSetting


def preset_section(target: str | Path, setting: ServerSetting, draft: str | Path | None) -> dict:
    """One preset: the target model and the setting's flags (``-md`` when it speculates)."""
    flags = setting.flags(draft if setting.uses_draft_model else None)
    return {
        "model": str(target),
        **{flags[i].lstrip("-"): flags[i + 1] for i in range(0, len(flags), 2)},
    }


def presets_ini(sections: Mapping[str, Mapping[str, object]]) -> str:
    """The presets file of llama-server's router mode, one ``[name]`` section per preset."""
    lines = ["version = 1", ""]
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {value}" for key, value in keys.items()]
        lines.append("")
    return "\n".join(lines)


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


def draft_agreement(
    server: LlamaRouter,
    draft_preset: str,
    prompt: list[int],
    output: Sequence[int],
    window: int = 8,
) -> np.ndarray:
    """``a[t]``: whether the draft's greedy token after ``prompt + output[:t]`` is ``output[t]``.

    One request per disagreement: from position t the draft continues greedily for up to
    ``window`` tokens; the first r agree with the output, and (if the output goes on) the next
    one does not, so the following request starts at t + r + 1 (the prompt cache reused)."""
    n, t = len(output), 0
    agree = np.zeros(n, bool)
    while t < n:
        answer = server.post(
            "/completion",
            {
                "model": draft_preset,
                "prompt": prompt + list(output[:t]),
                "n_predict": min(window, n - t),
                "return_tokens": True,
                "cache_prompt": True,
                **GREEDY,
            },
        )
        drafted = list(answer.get("tokens") or [])
        run = 0
        while run < min(len(drafted), n - t) and drafted[run] == output[t + run]:
            run += 1
        agree[t : t + run] = True
        if run == min(window, n - t) and run == len(drafted):
            t += run  # the whole window agreed: the next one is not known yet
        else:
            t += run + 1  # output[t + run] is not the draft's token there
    return agree


def top_logprobs(
    server: LlamaRouter, preset: str, prompt: list[int], n: int = 2
) -> list[tuple[int, float]]:
    """The ``n`` most likely next tokens after ``prompt`` and their log-probabilities (before
    sampling), as the preset's model gives them."""
    answer = server.post(
        "/completion",
        {
            "model": preset,
            "prompt": prompt,
            "n_predict": 1,
            "n_probs": n,
            "cache_prompt": True,
            **GREEDY,
        },
    )
    (first,) = answer["completion_probabilities"]
    return [(int(x["id"]), float(x["logprob"])) for x in first["top_logprobs"]]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (the shorter one's end included)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


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


def chain_counts(agree: Sequence[bool], k: int) -> ChainCounts:
    """Greedy chains of ``k`` drafts over an output of ``len(agree)`` tokens: the first token
    comes from the prompt's pass; then each step drafts min(k, tokens left - 1) tokens and
    accepts the run of agreeing ones, plus the target's own token."""
    n = len(agree)
    t, drafted, accepted, steps = 1 if n else 0, 0, 0, 0
    while t < n:
        left = n - t
        width = min(k, left - 1)
        run = 0
        while run < width and agree[t + run]:
            run += 1
        drafted += width
        accepted += run
        steps += 1
        t += run + 1
    return ChainCounts(n, drafted, accepted, steps)


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


def agreement_steps(
    agreements: Mapping[str, np.ndarray], domains: Mapping[str, str], max_k: int
) -> pd.DataFrame:
    """The step records a chain drafter of ``max_k`` would leave on these outputs, one row per
    output position t (as a measurement run has): ``accepted_len`` the run of agreeing tokens from
    t (at most ``max_k``), ``tree_size`` the drafts that fit before the output's end."""
    if max_k < 1:
        raise LlamaToolsError(f"a chain needs max_k >= 1 drafts, got {max_k}")
    rows = []
    for prompt in sorted(agreements):
        agree = np.asarray(agreements[prompt], bool)
        n = len(agree)
        # run[t]: agreeing tokens from t on, found backwards
        run = np.zeros(n + 1, np.int64)
        for t in range(n - 1, -1, -1):
            run[t] = run[t + 1] + 1 if agree[t] else 0
        rows += [
            (prompt, domains[prompt], t, min(int(run[t]), max_k), min(max_k, n - t))
            for t in range(n)
        ]
    columns = ["prompt_id", "domain", "step", "accepted_len", "tree_size"]
    return pd.DataFrame(rows, columns=columns)


@dataclass(frozen=True)
class ChainPrediction:
    """Predicted tokens per step of a chain of ``k`` drafts in one domain."""

    domain: str
    k: int
    prediction: Prediction  # method "replay" (within the window) or extrapolated


def chain_predictions(
    agreements: Mapping[str, np.ndarray],
    domains: Mapping[str, str],
    ks: Sequence[int],
    max_k: int,
    min_count: int = 20,
) -> tuple[ChainPrediction, ...]:
    """Per domain (sorted) and K: tokens per step of a chain of K, replayed where K <= ``max_k``
    (the drafts each agreement window holds), extrapolated from the acceptance vector (depths
    past ``max_k`` taking its deepest rate) beyond; see the module's docstring for the count."""
    if not agreements:
        raise LlamaToolsError("no agreements to predict from: measure some prompts first")
    steps = agreement_steps(agreements, domains, max_k)
    vectors = {
        name: vector.extrapolated(max(max(ks), max_k))
        for name, vector in chain_acceptance(steps, min_count).items()
    }
    predictor = Predictor(
        ReplayRecords.from_frames(pd.DataFrame(), steps), vectors, prefill_drafts=False
    )
    return tuple(
        ChainPrediction(domain, k, predictor.with_interval(TreeShape.chain(k), domain))
        for domain in sorted(set(steps["domain"]))
        for k in ks
    )
