"""A prompt item as the models see it: chat template, tokens, truncation, and when to stop.

Shared by measurement, decoding and the benchmarks; knows nothing of runs or records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    ids: list[int]
    truncated: bool


def render_prompt(tokenizer, messages: Sequence[dict], chat_template: bool,
                  max_tokens: int) -> RenderedPrompt:
    """Apply the chat template (or join the turns), tokenise, keep the last ``max_tokens``."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        text = "\n\n".join(str(m["content"]) for m in messages)
        ids = tokenizer(text)["input_ids"]
    return RenderedPrompt(text, ids[-max_tokens:], len(ids) > max_tokens)


def eos_token_ids(pair) -> set[int]:
    """The tokens that end a generation: the tokenizer's EOS and the target's generation config's."""
    ids = set()
    for value in (pair.tokenizer.eos_token_id,
                  getattr(pair.target.model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return ids
