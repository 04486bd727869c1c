"""transformers' ``generate()``, greedy and timed: plain decoding and assisted generation, the
references specscope's decoder is benched and tuned against.

Assisted generation with ``assistant_tokens`` = K drafts a chain of K tokens with the assistant at
every step (transformers' ``num_assistant_tokens`` = K on the ``constant`` schedule, its confidence
stop off), which is what tune replays and prices; without it transformers' defaults apply (up to 20
tokens, stopped by a draft-confidence threshold it re-fits during the generation), which nothing
replays. This module does not choose or compare (:mod:`.bench`, :mod:`.policy`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Generated:
    """One greedy ``generate()``: the new tokens and where the time went."""

    tokens: list[int]
    time_s: float  # the whole call
    first_token_s: float  # to the first new token (the prefill; assisted: the first step)
    first_tokens: int  # tokens that arrived then (assisted: the first step's)
    target_passes: int  # forward passes of the target: the prefill, then one per step


class _FirstTokenClock:
    """A transformers streamer that notes when the first new tokens arrive, and how many."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.calls = 0
        self.first_token_s = float("nan")
        self.first_tokens = 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first_token_s = time.perf_counter() - self.start
            self.first_tokens = int(value.numel())

    def end(self) -> None:
        pass


@contextmanager
def assisting(assistant, tokens: int | None) -> Iterator[None]:
    """``assistant`` drafting ``tokens`` per step on the constant schedule with no confidence stop,
    for the duration (transformers reads these from the assistant's generation config)."""
    if tokens is None:
        yield
        return
    config = assistant.generation_config
    fields = (
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
    )
    saved = {name: getattr(config, name, None) for name in fields}
    config.num_assistant_tokens = tokens
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0  # 0 turns the stop and its re-fitting off
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def hf_generate(
    model,
    prompt: list[int],
    max_new_tokens: int,
    eos: frozenset[int],
    assistant=None,
    assistant_tokens: int | None = None,
    min_new_tokens: int = 0,
) -> Generated:
    """``model.generate``, greedy; with ``assistant``: assisted generation drafting
    ``assistant_tokens`` per step (None: transformers' defaults). ``min_new_tokens`` holds EOS
    off until then (for timing a fixed length)."""
    ids = torch.tensor([prompt], device=model.device)
    eos_ids = sorted(eos) or None
    clock = _FirstTokenClock()
    passes = 0

    def count(*_) -> None:
        nonlocal passes
        passes += 1

    hook = model.register_forward_hook(count)
    try:
        with assisting(assistant, assistant_tokens):
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=min_new_tokens or None,
                do_sample=False,
                eos_token_id=eos_ids,
                streamer=clock,
                pad_token_id=eos_ids[0] if eos_ids else None,
                assistant_model=assistant,
            )
    finally:
        hook.remove()
    elapsed = time.perf_counter() - clock.start
    return Generated(
        out[0, len(prompt) :].tolist(), elapsed, clock.first_token_s, clock.first_tokens, passes
    )
