"""Draft and verify time measured on this hardware, and the predicted speed-up of a tree:
``tau / step time``, relative to plain decoding's time per token.

Plain decoding is timed as the bench runs it, with transformers' ``generate()``. A step has a
time model per backend: specscope's decoder (its draft and target passes by tokens fed, plus the
bookkeeping a real step adds) and transformers' assisted generation (whole steps timed by the
chain length K it drafts, :attr:`CostModel.assisted_step_s`).

A cost model records the drafter it was timed with (its kind and parameters, and the model that
drafts where there is one), and prices only runs of that drafter (:meth:`CostModel.check_drafter`):
a lookup's costs would price a draft model as one lookup.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..core.loop import DecodeConfig
from ..core.passes import crop, feed_causal, position_limit, prefill
from ..decode import SpeculativeDecoder
from ..drafters import DrafterConfig
from ..files import read_json_object, write_json
from ..hardware import machine_line
from ..progress import counting
from ..schemas import INPUT, parse
from ..trees import TreeShape
from .acceptance import PolicyError
from .hf_generate import Generated, hf_generate

# --- cost model ----------------------------------------------------------------------------------


def interpolate(table: tuple[tuple[int, float], ...], x: float) -> float:
    xs, ys = zip(*table)
    if x > xs[-1]:  # extrapolate linearly from the last two points
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (x - xs[-1])
    return float(np.interp(x, xs, ys))


# what timed a cost model's plain decoding: transformers' generate(), or specscope's own loop
PLAIN_BACKENDS = ("transformers", "specscope")


@dataclass(frozen=True)
class CostModel:
    """Seconds per forward pass, measured on this hardware, by tokens fed over a prefix cache.

    A step of a static tree costs one draft call for the pending tokens (about ``root_tokens``),
    one per deeper level (as many tokens as the level's nodes that have children), one target call
    for the last token plus every node, times ``step_scale``, plus ``overhead_s`` of bookkeeping.
    ``step_scale`` is what real steps of a decode cost over the sum of their timed passes (the
    passes are timed alone; a decode's run back to back); ``overhead_s`` the older, additive form
    of the same correction (files written before). Plain decoding costs
    ``plain_token_s`` per token. A model-free drafter (``model_free``: n-gram lookup) drafts with
    one lookup per step, ``draft_s[0]``, whatever the tree; a step where it proposes nothing is
    one target pass of the newest token, which costs ``empty_step_scale`` times plain decoding's
    token (specscope's step without ``generate()``'s per-token work: a real decode's such steps
    over the plain token timed beside it; see :meth:`step_time`'s ``proposal_rate``).

    ``drafter`` is the drafter timed and ``drafter_model`` the model that drafts for it (the
    draft model, or the target an early exit is cut from: its fingerprint, else its source at its
    revision); None where not recorded (files written before cost models recorded their drafter).

    ``assisted_step_s``: (K, seconds per step) of transformers' assisted generation drafting a
    chain of K with the draft model (empty: not timed; only a draft model's cost model has it).
    ``plain_backend``: what timed ``plain_token_s``: ``transformers`` (``generate()``, as the
    bench runs plain decoding) or ``specscope`` (its own loop: files written before).
    """

    draft_s: tuple[tuple[int, float], ...]  # (tokens fed, seconds), increasing tokens
    target_s: tuple[tuple[int, float], ...]
    plain_token_s: float
    overhead_s: float = 0.0
    step_scale: float = 1.0
    empty_step_scale: float = 1.0
    root_tokens: int = 2
    context_len: int = 0
    hardware: str = ""
    model_free: bool = False
    drafter: DrafterConfig | None = None
    drafter_model: str | None = None
    assisted_step_s: tuple[tuple[int, float], ...] = ()
    plain_backend: str = "specscope"

    __pydantic_config__ = INPUT  # a cost model file's schema (specscope.schemas)

    def __post_init__(self) -> None:
        if self.drafter is not None and self.drafter.has_distribution == self.model_free:
            raise PolicyError(
                f"cost model: model_free is {str(self.model_free).lower()}, but its drafter "
                f"{self.drafter.label} {'runs a model' if self.drafter.has_distribution else 'runs none'}"
            )
        for name in ("draft_s", "target_s", "assisted_step_s"):
            table = getattr(self, name)
            if not table and name != "assisted_step_s":
                raise PolicyError(f"cost model: {name} is empty; it needs (tokens, seconds) pairs")
            for tokens, seconds in table:
                _check_number(f"{name} tokens", tokens, integer=True, low=1)
                _check_number(f"{name} seconds at {tokens} tokens", seconds, positive=True)
            sizes = [tokens for tokens, _ in table]
            if sizes != sorted(set(sizes)):
                raise PolicyError(
                    f"cost model: {name} must list increasing token counts, got {sizes}"
                )
        if self.plain_backend not in PLAIN_BACKENDS:
            raise PolicyError(
                f"cost model: plain_backend must be one of {', '.join(PLAIN_BACKENDS)}, got "
                f"{self.plain_backend!r}"
            )
        _check_number("plain_token_s", self.plain_token_s, positive=True)
        _check_number("overhead_s", self.overhead_s, low=0)
        _check_number("step_scale", self.step_scale, positive=True)
        _check_number("empty_step_scale", self.empty_step_scale, positive=True)
        _check_number("root_tokens", self.root_tokens, integer=True, low=1)
        _check_number("context_len", self.context_len, integer=True, low=0)

    def draft_time(self, shape: TreeShape, levels: int | None = None) -> float:
        """The draft calls of a step: the pending tokens, then each level's nodes that have
        children (only the first ``levels`` levels where a stop rule cut the rest)."""
        if self.model_free:
            return self.draft_s[0][1]
        calls = [self.root_tokens] + [
            sum(1 for n in shape.nodes_at_depth(d) if shape.children[n])
            for d in range(1, shape.max_depth)
        ][:levels]
        return sum(interpolate(self.draft_s, k) for k in calls if k)

    def verify_time(self, shape: TreeShape) -> float:
        return interpolate(self.target_s, 1 + len(shape))

    def assisted_step_time(self, k: int) -> float:
        """Seconds per step of transformers' assisted generation drafting a chain of ``k``."""
        if not self.assisted_step_s:
            raise PolicyError("this cost model has no assisted-generation step times")
        return interpolate(self.assisted_step_s, k)

    def step_time(self, shape: TreeShape, proposal_rate: float = 1.0) -> float:
        """Expected seconds per step when the drafter proposes in a fraction ``proposal_rate`` of
        steps (a model-free lookup without a match; 1 for a draft model): the draft, then a
        verification of the tree, or else a pass of the newest token alone."""
        verify = proposal_rate * self.verify_time(shape)
        empty = (1 - proposal_rate) * self.empty_step_scale * self.plain_token_s
        return self.step_scale * (self.draft_time(shape) + verify) + empty + self.overhead_s

    def stopped_step_time(self, shape: TreeShape, verified, fed) -> float:
        """Mean seconds per step of ``shape`` cut by a stop rule, priced as :meth:`step_time`
        prices the steps it is made of: ``verified[n]`` is the share of steps that verified n
        nodes (0: a pass of the newest token alone), ``fed[k]`` the share whose draft fed k
        levels past its root call (:meth:`draft_time`); both from the replay of the records."""
        draft = sum(w * self.draft_time(shape, k) for k, w in enumerate(fed))
        verify = sum(w * interpolate(self.target_s, 1 + n) for n, w in enumerate(verified) if n)
        empty = verified[0] * self.empty_step_scale * self.plain_token_s
        return self.step_scale * (draft + verify) + empty + self.overhead_s

    def to_dict(self) -> dict:
        return {
            "draft_s": [list(x) for x in self.draft_s],
            "target_s": [list(x) for x in self.target_s],
            "plain_token_s": self.plain_token_s,
            "overhead_s": self.overhead_s,
            "step_scale": self.step_scale,
            "empty_step_scale": self.empty_step_scale,
            "root_tokens": self.root_tokens,
            "context_len": self.context_len,
            "hardware": self.hardware,
            **({"model_free": True} if self.model_free else {}),
            **({"drafter": self.drafter.table} if self.drafter is not None else {}),
            **({"drafter_model": self.drafter_model} if self.drafter_model is not None else {}),
            "plain_backend": self.plain_backend,
            **(
                {"assisted_step_s": [list(x) for x in self.assisted_step_s]}
                if self.assisted_step_s
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: dict, where: str = "cost model") -> CostModel:
        """A cost model from its JSON form (read from ``where``), checked by its schema (this
        class, :mod:`specscope.schemas`): types, unknown keys, then ranges."""
        return parse(cls, data, where, PolicyError)

    def save(self, path: str | Path, inside: Path | None = None) -> Path:
        """Write as strict JSON (see :func:`specscope.files.write_output` for ``inside``)."""
        return write_json(path, self.to_dict(), inside)

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return cls.from_dict(
            read_json_object(path, PolicyError, "cost model"), f"cost model {path}"
        )

    def check_drafter(self, drafter: DrafterConfig, model: str | None) -> str | None:
        """Refuse to price a run of ``drafter`` (drafting with ``model``, see
        :func:`drafting_model`) with this cost model unless it was timed for that drafter: the
        same kind and parameters, and the same model where both know it.

        A file that records no drafter (written before cost models did) is taken, with the
        warning returned, only where its ``model_free`` flag gives the run's kind: a lookup's
        costs for an n-gram run, a model's for a draft-model run (the one model drafter before
        early exits; an early exit's costs depend on its exit layer, which such a file does not
        record, so an early-exit run is refused). Any other pairing misprices the drafter and is
        refused, naming both."""
        retime = "re-time it for this run: specscope tune RUN --save-costs FILE"
        if self.drafter is None:
            timed = "a model-free drafter (n-gram lookup)" if self.model_free else "a model"
            assumed = {True: "ngram", False: "draft-model"}[self.model_free]
            if drafter.kind == assumed:
                return (
                    f"warning: the cost model records no drafter; timed for {timed}, it is taken "
                    f"as {drafter.label}'s ({retime} to record it)"
                )
            raise PolicyError(
                f"the cost model records no drafter (it was written before cost models did) "
                f"and was timed for {timed}; the run measured {drafter.label}, which it would "
                f"misprice: {retime}"
            )
        if self.drafter.label != drafter.label:
            raise PolicyError(
                f"the cost model was timed for drafter {self.drafter.label}, but the run "
                f"measured {drafter.label}: its costs would misprice that drafter; {retime}"
            )
        if self.drafter_model and model and self.drafter_model != model:
            raise PolicyError(
                f"the cost model was timed for {drafter.label} drafting with {self.drafter_model}, "
                f"but the run's drafts came from {model}; {retime}"
            )
        return None


def drafting_model(models: dict, drafter: DrafterConfig) -> str | None:
    """The model that drafts for ``drafter`` in a pair's provenance (a run manifest's
    ``models``, or :attr:`ModelPair.provenance`): the draft model's, or for an early exit the
    target's, fingerprint (else its source, and its revision where one was asked for); None for
    a model-free drafter or when not known."""
    from ..models.config import named  # lazily: the models package imports transformers

    role = {"draft-model": "draft", "early-exit": "target"}.get(drafter.kind)
    identity = models.get(role) if role and isinstance(models, dict) else None
    if not isinstance(identity, dict):
        return None
    if identity.get("fingerprint"):
        return str(identity["fingerprint"])
    source = identity.get("source")
    return named(str(source), identity.get("revision")) if source else None


def _check_number(
    name: str, value, *, integer: bool = False, low: float | None = None, positive: bool = False
) -> None:
    """Refuse a cost-model value that is not a number of the right kind and range."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise PolicyError(
            f"cost model: {name} must be a finite "
            f"{'integer' if integer else 'number'}, got {value!r}"
        )
    if positive and value <= 0:
        raise PolicyError(f"cost model: {name} must be > 0 seconds, got {value!r}")
    if low is not None and value < low:
        raise PolicyError(f"cost model: {name} must be >= {low}, got {value!r}")


# --- measuring costs ----------------------------------------------------------------------------

COST_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
COST_DECODE_TOKENS = 16  # tokens of the plain and speculative decodes timed, by default
ASSISTED_CHAINS = (1, 2, 3, 4, 6, 8)  # chain lengths K of assisted generation timed
CALIBRATION_CHAIN = 3  # the chain a real decode drafts to calibrate step_scale


def time_forward(model, cache, base: int, k: int, repeats: int, vocab: int) -> float:
    """Median seconds of one forward of ``k`` tokens over a cache of ``base`` entries."""
    times = []
    past = torch.ones(1, base, dtype=torch.bool)  # one row that sees every cached entry
    for _ in range(repeats):
        ids = torch.randint(0, vocab, (1, k))
        t0 = time.perf_counter()
        feed_causal(model, cache, ids, past)
        times.append(time.perf_counter() - t0)
        crop(cache, base)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def measure_costs(
    decoder: SpeculativeDecoder,
    context_len: int = 256,
    sizes: Sequence[int] = COST_SIZES,
    repeats: int = 3,
    hardware: str = "",
    target_costs: CostModel | None = None,
    drafter: DrafterConfig | None = None,
    drafter_model: str | None = None,
    text: Sequence[int] | None = None,
    decode_tokens: int = COST_DECODE_TOKENS,
) -> CostModel:
    """Time draft and target forwards by tokens fed, plain decoding per token, assisted steps and
    real speculative steps, over a context of ``context_len`` tokens: the first ``context_len``
    of ``text`` (real text, which the models continue as they continue a prompt, so that drafts
    are accepted as often as in use), else random tokens (every draft refused). The timed decodes
    (plain, assisted, specscope's) each generate ``decode_tokens``: as many as the outputs a
    prediction is for, so that the shorter last steps weigh as much as they do there.

    A real decode drafting a chain of ``CALIBRATION_CHAIN`` gives ``step_scale``: the time of its
    steps that proposed over what the timed passes price them at as a prediction does (the
    whole chain, though the output's end cut it shorter), and ``empty_step_scale``: the mean
    time of its steps that proposed nothing over plain decoding's token (1 where none did);
    each round's steps taken over the plain ``generate()`` timed in that round (so that the
    machine's speed then, not when ``target_costs`` was timed, divides out), medians over
    rounds.

    Everything is timed in ``repeats`` rounds, each round timing every quantity once (every pass
    size of both models, a plain ``generate()``, an assisted step per K, a real decode), and each
    figure is the median over rounds: a machine whose speed drifts during the measurement moves
    every figure alike, so the ratios a prediction is made of keep (timing each quantity's
    repeats back to back put the drift between quantities). ``target_costs``: take the target's
    passes and plain decoding from this model (measured with another drafter of the same
    target), so that drafters are weighed against one target table. ``drafter`` and
    ``drafter_model``: what ``decoder`` drafts with, recorded in the model. The context and the
    longest timed pass must fit the models' positions."""
    limit = position_limit(*(m for m in (decoder.draft, decoder.target) if m is not None))
    need = max(max(sizes), decode_tokens + 2)  # the longest pass, or the timed decodes
    if context_len + need > limit:
        raise PolicyError(
            f"context_len must be in 1..{limit - need} for these models ({limit} positions, "
            f"{need} of them for the timed passes), got {context_len}"
        )
    if text is not None:
        if len(text) < context_len:
            raise PolicyError(f"text has {len(text)} tokens, fewer than context_len {context_len}")
        context = list(text[:context_len])
    else:
        generator = torch.Generator().manual_seed(0)
        context = torch.randint(
            0, min(decoder.vocab, 1000), (context_len,), generator=generator
        ).tolist()
    timed_target = target_costs is None
    draft_model = decoder.draft is not None and (drafter is None or drafter.kind == "draft-model")
    models = {"draft": decoder.draft} if decoder.draft is not None else {}
    if timed_target:
        models["target"] = decoder.target
    caches = {name: prefill(model, context)[0] for name, model in models.items()}
    for name, model in models.items():  # warm-up: the first passes run cold
        for k in (1, 1, 1, max(sizes)):
            time_forward(model, caches[name], context_len, k, 1, decoder.vocab)
    hf_generate(decoder.target, context, 2, frozenset())
    if draft_model:
        hf_generate(decoder.target, context, 2, frozenset(), decoder.draft, ASSISTED_CHAINS[0])
    samples: dict[tuple[str, int], list[float]] = {}
    chain = TreeShape.chain(CALIBRATION_CHAIN)
    config = DecodeConfig(max_new_tokens=decode_tokens)
    decodes = []
    # what a round times: every pass size of each model, a lookup, a plain generate(), an
    # assisted step per K, a real decode
    per_round = len(sizes) + 2 + (decoder.lookup is not None)
    per_round += len(ASSISTED_CHAINS) if draft_model else 0
    with counting("timing costs", "timings", repeats * per_round) as advance:
        for _ in range(repeats):
            for k in sizes:
                for name, model in models.items():
                    t = time_forward(model, caches[name], context_len, k, 1, decoder.vocab)
                    samples.setdefault((name, k), []).append(t)
                advance()
            if decoder.lookup is not None:
                lookup = time_lookup(decoder.lookup, context, max(sizes), 1)
                samples.setdefault(("lookup", 1), []).append(lookup)
                advance()
            plain = plain_generate_s(decoder.target, context, decode_tokens)
            samples.setdefault(("plain", 1), []).append(plain)
            advance()
            if draft_model:
                for k in ASSISTED_CHAINS:
                    t = assisted_step_s(decoder.target, decoder.draft, context, k, decode_tokens)
                    samples.setdefault(("assisted", k), []).append(t)
                    advance()
            decodes.append((decoder.generate(context, chain, config).steps[1:], plain))
            advance()

    def table(name: str) -> tuple[tuple[int, float], ...]:
        return tuple((k, _median(t)) for (n, k), t in samples.items() if n == name)

    model = CostModel(
        draft_s=table("lookup") if decoder.lookup is not None else table("draft"),
        target_s=table("target") if timed_target else target_costs.target_s,
        plain_token_s=_median(samples[("plain", 1)])
        if timed_target
        else target_costs.plain_token_s,
        context_len=context_len,
        hardware=hardware or _hardware(),
        model_free=decoder.lookup is not None,
        drafter=drafter,
        drafter_model=drafter_model,
        assisted_step_s=table("assisted"),
        plain_backend="transformers" if timed_target else target_costs.plain_backend,
    )

    # each round's real steps set against that round's plain token: a prediction is a ratio to
    # plain decoding, and the round's plain time carries the machine's speed at that moment (the
    # passes of ``target_costs`` were timed minutes before). Steps that proposed: their time over
    # what the passes price them at as a prediction does (the whole chain, though the output's
    # end cut it shorter); steps that proposed nothing: their time over plain's token
    scales, empties = [], []
    for steps, plain in decodes:
        proposed = [s.step_time_s for s in steps if s.tree_size > 0]
        empty = [s.step_time_s for s in steps if s.tree_size == 0]
        if proposed:
            priced = len(proposed) * model.step_time(chain) / model.plain_token_s
            scales.append(sum(proposed) / plain / priced)
        if empty:
            empties.append(sum(empty) / len(empty) / plain)
    return replace(
        model,
        step_scale=_median(scales) if scales else 1.0,
        empty_step_scale=_median(empties) if empties else 1.0,
    )


def _median(values: Sequence[float]) -> float:
    return float(np.median(values))


def _after_first(g: Generated) -> tuple[int, float]:
    """Tokens and seconds of a timed ``generate()`` after its first new tokens arrived."""
    return len(g.tokens) - g.first_tokens, g.time_s - g.first_token_s


def plain_generate_s(target, context: list[int], tokens: int) -> float:
    """Seconds per token of one transformers greedy ``generate()`` of ``tokens`` over
    ``context``, after the first token (the bench's plain decoding)."""
    g = hf_generate(target, context, tokens, frozenset(), min_new_tokens=tokens)
    after, seconds = _after_first(g)
    return seconds / after


def assisted_step_s(target, draft, context: list[int], k: int, tokens: int) -> float:
    """Seconds per step of one transformers assisted ``generate()`` drafting a chain of ``k``
    of ``tokens`` over ``context``: its time after the first step over the target passes after
    the first."""
    g = hf_generate(target, context, tokens, frozenset(), draft, k, tokens)
    return _after_first(g)[1] / max(1, g.target_passes - 1)


def time_lookup(lookup, context: list[int], k: int, repeats: int) -> float:
    """Median seconds of one model-free proposal over ``context`` (each timing a batch of 20
    calls, the lookup being far shorter than a forward pass)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(20):
            lookup(context, k)
        times.append((time.perf_counter() - t0) / 20)
    return sorted(times)[len(times) // 2]


def _hardware() -> str:
    return f"{machine_line()}, {torch.get_num_threads()} threads"
