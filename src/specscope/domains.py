"""Prompts and where they come from: prompt items, JSONL files and the built-in smoke set.

A prompt item is one request: a stable id, its domain, the prompt as chat messages, and where it
came from (source name and the index of the item in that source).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


class PromptSourceError(ValueError):
    """Bad prompt input: the message says what was wrong and what is allowed."""


@dataclass(frozen=True)
class PromptItem:
    id: str
    domain: str
    messages: tuple[dict, ...]  # ({"role": "user", "content": "..."}, ...)
    source: str = "inline"
    source_index: int = -1
    metadata: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_empty(self) -> bool:
        return not any(str(m.get("content", "")).strip() for m in self.messages)


SMOKE_PROMPTS: tuple[PromptItem, ...] = tuple(
    PromptItem(id=f"smoke-{domain}", domain=domain,
               messages=({"role": "user", "content": text},), source="smoke", source_index=i)
    for i, (domain, text) in enumerate(
        [
            ("code", 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'),
            ("math", "Solve for x: 3x + 7 = 22. Show your steps."),
            ("reasoning", "Tom has 3 boxes with 12 apples each. He gives away 9 apples. "
                          "How many apples does he have left?"),
            ("chat", "Write a short, friendly note inviting a colleague to lunch on Friday."),
        ]
    )
)


def _item_from_json(obj: object, where: str, default_domain: str | None, index: int,
                    source: str) -> PromptItem:
    if not isinstance(obj, dict):
        raise PromptSourceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    domain = obj.get("domain", default_domain)
    if not domain:
        raise PromptSourceError(f"{where}: no 'domain' (give one per line or one for the file)")
    if "messages" in obj:
        messages = obj["messages"]
        if not (isinstance(messages, list) and all(
                isinstance(m, dict) and "role" in m and "content" in m for m in messages)):
            raise PromptSourceError(
                f"{where}: 'messages' must be a list of {{'role', 'content'}} objects")
    elif "prompt" in obj:
        if not isinstance(obj["prompt"], str):
            raise PromptSourceError(f"{where}: 'prompt' must be a string")
        messages = [{"role": "user", "content": obj["prompt"]}]
    else:
        raise PromptSourceError(f"{where}: needs 'prompt' (a string) or 'messages' (chat turns)")
    item_id = str(obj.get("id", f"{Path(source).stem}-{index}"))
    return PromptItem(id=item_id, domain=str(domain), messages=tuple(messages),
                      source=f"jsonl:{source}", source_index=index)


def read_jsonl(path: str | Path, domain: str | None = None) -> list[PromptItem]:
    """Read ``{"id", "domain", "prompt"}`` or ``{"id", "domain", "messages"}`` lines."""
    path = Path(path)
    if not path.is_file():
        raise PromptSourceError(f"prompt file {path} does not exist")
    items, seen = [], set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptSourceError(f"{where}: not valid JSON ({e.msg})") from None
        item = _item_from_json(obj, where, domain, len(items), str(path))
        if item.id in seen:
            raise PromptSourceError(f"{where}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    return items
