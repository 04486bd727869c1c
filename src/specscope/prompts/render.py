"""A prompt item as the models see it: the rendering, tokens, truncation, and when to stop.

A *rendering* (:data:`RENDERINGS`) is a named, recorded choice of how a prompt item becomes the
text the models read:

- ``task`` (the default): what the domain's task needs. The chat template with the generation
  prompt, then the item's ``reply_prefix`` as the start of the model's reply: a HumanEval item's
  reply opens with its function signature and docstring in a code block, so the target writes the
  function body (as instruct-model code evaluations prefill it) rather than copying the prompt.
  Items without a reply prefix (math, reasoning, chat) render as ``chat``.
- ``chat``: the chat template with the generation prompt; the model writes its whole reply.
- ``raw``: the turns' texts joined by blank lines, no template (the paper's code fed raw prompts).

A tokenizer without a chat template renders ``task`` and ``chat`` as ``raw`` (``task`` then
appends the reply prefix after a blank line). Shared by measurement, decoding and the benchmarks;
knows nothing of runs or records.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .items import PromptSourceError


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    ids: list[int]
    truncated: bool


def _raw(tokenizer, messages: Sequence[dict], reply_prefix: str) -> tuple[str, bool]:
    return "\n\n".join(str(m["content"]) for m in messages), True


def _chat(tokenizer, messages: Sequence[dict], reply_prefix: str) -> tuple[str, bool]:
    if not getattr(tokenizer, "chat_template", None):
        return _raw(tokenizer, messages, reply_prefix)
    return tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=False
    ), False


def _task(tokenizer, messages: Sequence[dict], reply_prefix: str) -> tuple[str, bool]:
    text, raw = _chat(tokenizer, messages, reply_prefix)
    if reply_prefix:
        text = f"{text}\n\n{reply_prefix}" if raw else text + reply_prefix
    return text, raw


# name -> (tokenizer, messages, reply prefix) -> (text, whether the tokenizer adds special tokens)
RENDERINGS: dict[str, Callable[..., tuple[str, bool]]] = {
    "task": _task,
    "chat": _chat,
    "raw": _raw,
}


def check_rendering(name: str) -> str:
    if name not in RENDERINGS:
        raise PromptSourceError(f"unknown rendering {name!r}; allowed: {', '.join(RENDERINGS)}")
    return name


# tokens at the front of a cut text that the cut may have changed (a token split in two, a
# pre-tokenizer's word begun mid-way): tokenised, then dropped with the rest of the front
CUT_MARGIN_TOKENS = 64


@functools.lru_cache(maxsize=8)
def longest_token_chars(tokenizer) -> int:
    """The most characters one token of ``tokenizer`` can stand for: the longest entry of its
    vocabulary and added tokens (a byte-level token's entry has one character per byte, at least
    as many as the text it decodes to)."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def _cut(tokenizer, text: str, max_tokens: int) -> str:
    """The end of ``text`` that holds at least its last ``max_tokens`` tokens and the margin
    before them, so that tokenising it gives the same last ``max_tokens`` tokens as tokenising
    the whole (every token stands for at most :func:`longest_token_chars` characters): a prompt
    of 50 MB is tokenised as a few hundred kB, in bounded time and memory."""
    keep = (max_tokens + CUT_MARGIN_TOKENS) * longest_token_chars(tokenizer)
    return text[-keep:] if len(text) > keep else text


def render_prompt(
    tokenizer, messages: Sequence[dict], rendering: str, max_tokens: int, reply_prefix: str = ""
) -> RenderedPrompt:
    """Render the turns (and the reply's start) as ``rendering`` says, tokenise, keep the last
    ``max_tokens``. A text longer than those tokens can span is cut first (:func:`_cut`): the
    text kept is what was tokenised, the ids the same as the whole text's last ``max_tokens``."""
    text, special = RENDERINGS[check_rendering(rendering)](tokenizer, messages, reply_prefix)
    cut = _cut(tokenizer, text, max_tokens)
    ids = tokenizer(cut, add_special_tokens=special)["input_ids"]
    return RenderedPrompt(cut, ids[-max_tokens:], len(cut) < len(text) or len(ids) > max_tokens)


def render_item(tokenizer, item, rendering: str, max_tokens: int) -> RenderedPrompt:
    """:func:`render_prompt` of a :class:`~specscope.prompts.items.PromptItem`."""
    return render_prompt(tokenizer, item.messages, rendering, max_tokens, item.reply_prefix)


def eos_token_ids(pair) -> set[int]:
    """The tokens that end a generation: the tokenizer's EOS and the target's generation config's."""
    ids = set()
    for value in (
        pair.tokenizer.eos_token_id,
        getattr(pair.target.model.generation_config, "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return ids


def rendering_of(config: dict) -> str:
    """The rendering a run's manifest config names (runs made before renderings: ``chat`` or
    ``raw`` from their ``chat_template``)."""
    if "rendering" in config:
        return check_rendering(config["rendering"])
    return "chat" if config.get("chat_template", True) else "raw"
