"""The one schema layer of the files users hand in: each declared once, checked on read.

A file's schema is its dataclass (``RunConfig`` and its sections, a sweep's ``Execution``) or a
pydantic model where no dataclass holds it (a prompts file's line, the part of a policy file the
gateway reads). :func:`parse` validates TOML- or JSON-like data against it with pydantic, in
strict mode (``"3"`` is not an integer, ``"true"`` is not a boolean, a list is not a string) and
with unknown keys refused (``__pydantic_config__ = INPUT`` on each dataclass), and turns the first
error into one line that names the file (or ``path:line``), the key, the value and what is
allowed. A check that a dataclass makes itself (``__post_init__``: a range, a known name) is
reported the same way, its message after the file and the table it failed in.

Why pydantic: it validates the dataclasses the library already uses (one declaration, not a model
beside each), reports every error with its location, and generates each file's JSON Schema
(:func:`json_schema`; :mod:`specscope.input_files` lists the files, and the reference page of
input files shows each schema). msgspec is faster but
validates only its own Struct types; cattrs generates no JSON Schema.

Knows nothing of what the files mean; reads no file.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from functools import cache
from typing import Any, TypeVar

from pydantic import AliasChoices, BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from .errors import SpecscopeError

# the config of every input schema: unknown keys are refused (strictness is asked per call)
INPUT = ConfigDict(extra="forbid")

T = TypeVar("T")

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "tuple_type": "a list",
    "list_type": "a list",
    "dict_type": "a table (an object)",
    "dataclass_type": "a table (an object)",
    "model_type": "a table (an object)",
    "model_attributes_type": "a table (an object)",
    "none_required": "none",
}


@cache
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def parse(
    kind: type[T], data: object, where: str, error: type[SpecscopeError], section: str = ""
) -> T:
    """``data`` (read from ``where``: a file or ``path:line``; ``section``: the table of that file
    it is) as ``kind``, or ``error`` with one line naming ``where``, the key, the value and what is
    allowed."""
    try:
        text = json.dumps(data, default=str, allow_nan=True)
    except (TypeError, ValueError, RecursionError) as e:  # not JSON-like: a key that is a tuple
        raise error(f"{where}: not a JSON-like value ({e})") from None
    try:
        return _adapter(kind).validate_json(text, strict=True)
    except ValidationError as e:
        raise error(describe(e, kind, where, section)) from None
    except SpecscopeError as e:  # a dataclass's own check of a class pydantic does not catch
        raise (e if isinstance(e, error) else error(f"{where}: {e}")) from None


def _key(loc: tuple) -> str:
    out = ""
    for part in loc:
        part = part if isinstance(part, int) or str(part).isprintable() else repr(part)
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(e: ValidationError, kind: Any, where: str, section: str = "") -> str:
    """The first error of ``e`` in one line: ``where: key must be X, got V``. A value that fits
    no member of a union (``str | int | None``) is described by the union, unless a member's
    constraint (a length, a bound) is what it missed."""
    errors = [(_strip_tags(kind, tuple(x["loc"])), x) for x in e.errors()]
    loc, err = errors[0]
    if err["type"].endswith("_type"):  # a union's member that got further in says more
        deeper = (x for x in errors if len(x[0]) > len(loc) and x[0][: len(loc)] == loc)
        loc, err = next(deeper, errors[0])
    tried = [x for at_loc, x in errors if at_loc == loc]
    err = next((x for x in tried if not x["type"].endswith("_type")), err)
    typ = err["type"]
    key = _key(((section,) if section else ()) + loc)
    at = ": ".join(part for part in (where, key) if part)
    value = err.get("input")
    if loc[-1:] == ("[key]",):  # a table's key itself (pydantic's loc: the table, the key, [key])
        table = ": ".join(x for x in (where, _key(loc[:-2])) if x)
        return f"{table} has a key {loc[-2]!r}: {err['msg']}"
    if typ in ("unexpected_keyword_argument", "extra_forbidden"):
        allowed = _allowed_keys(kind, loc[:-1])
        listed = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"{where + ': ' if where else ''}unknown key {key!r}{listed}"
    if typ == "json_invalid":  # the JSON is json.dumps's own: only a lone surrogate breaks it
        return f"{where}: holds text that is not valid Unicode (a lone surrogate such as \\ud800)"
    if typ == "missing":
        return f"{at} is missing; give {_described(_type_at(kind, loc))}"
    if typ in ("value_error", "assertion_error"):  # a dataclass's own check (a range, a name)
        return ": ".join(x for x in (at, str((err.get("ctx") or {}).get("error", err["msg"]))) if x)
    if typ == "literal_error":
        expected = f"one of {(err.get('ctx') or {}).get('expected', '')}"
    elif typ in ("too_short", "too_long"):
        ctx = err.get("ctx") or {}
        low, high = ctx.get("min_length"), ctx.get("max_length")
        if high is None:
            expected = f"a list of at least {low} item{'s' if low != 1 else ''}"
        elif low is None:
            expected = f"a list of at most {high} items"
        else:
            expected = f"a list of {low if low == high else f'{low} to {high}'} items"
    elif typ.startswith(("greater_than", "less_than")):
        bound = next(iter((err.get("ctx") or {}).values()), "")
        bound = f"{bound:g}" if isinstance(bound, float) else bound
        sign = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<"}.get(typ, "<=")
        noun = "an integer" if _described(_type_at(kind, loc)).startswith("an int") else "a number"
        expected = f"{noun} {sign} {bound}"
    elif typ == "string_too_short":
        expected = "a non-empty string"
    elif _is_union(_type_at(kind, loc)):
        expected = _described(_type_at(kind, loc))
    else:
        expected = _EXPECTED.get(typ, err["msg"].removeprefix("Input should be ").lower())
    return f"{at} must be {expected}, got {_shown(value)}"


def _shown(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fields(kind: Any) -> dict[str, Any]:
    """The keys a table of ``kind`` may hold, and each key's type."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return {k: f.annotation for n, f in kind.model_fields.items() for k in _keys_of(n, f)}
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return {f.name: hints[f.name] for f in dataclasses.fields(kind) if f.init}
    return {}


def _keys_of(name: str, field: FieldInfo) -> list[str]:
    """The keys a model's field is read from: its name, its alias or each of its alias choices."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str)]
    return [alias if isinstance(alias, str) else name]


def _inner(tp: Any, part: object) -> Any:
    """The type that ``part`` (a key or an index) of a value of type ``tp`` has."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        found = [_inner(a, part) for a in args if a is not type(None)]
        return next((f for f in found if f is not None), None)
    if origin is typing.Annotated:
        return _inner(args[0], part)
    if origin in (tuple, list) and isinstance(part, int) and args:
        return args[0] if len(args) == 2 and args[1] is Ellipsis else args[min(part, len(args) - 1)]
    if origin is dict and args:
        return args[1]
    return _fields(tp).get(part) if isinstance(part, str) else None


def _type_at(kind: Any, loc: tuple) -> Any:
    tp = kind
    for part in loc:
        tp = _inner(tp, part)
        if tp is None:
            return None
    return tp


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _strip_tags(kind: Any, loc: tuple) -> tuple:
    """``loc`` without the tags pydantic puts in it for a union's members (``str``,
    ``list[ChatTurn]``), right after the union's own place: only the keys and indexes of the
    file. ``X | None`` has no tags."""
    tp, out, tagged = kind, [], _tagged(kind)
    for part in loc:
        if tagged and isinstance(part, str):
            tagged = False
            continue
        out.append(part)
        tp = _inner(tp, part)
        tagged = _tagged(tp)
    return tuple(out)


def _tagged(tp: Any) -> bool:
    """Whether pydantic tags the errors of a value of type ``tp`` with its member's name."""
    return _is_union(tp) and len([a for a in typing.get_args(tp) if a is not type(None)]) > 1


def _described(tp: Any) -> str:
    """What a value of type ``tp`` is, in words: ``a string or an integer or none``."""
    if _is_union(tp):
        args = typing.get_args(tp)
        ordered = sorted(args, key=lambda a: a is type(None))
        return " or ".join(dict.fromkeys(_described(a) for a in ordered))
    if typing.get_origin(tp) is typing.Annotated:
        return _described(typing.get_args(tp)[0])
    if tp is type(None):
        return "none"
    if typing.get_origin(tp) in (list, tuple):
        return "a list"
    if typing.get_origin(tp) is dict or _fields(tp):
        return "a table (an object)"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _allowed_keys(kind: Any, loc: tuple) -> list[str]:
    tp = _type_at(kind, loc)
    while _is_union(tp):
        tp = next((a for a in typing.get_args(tp) if _fields(a)), None)
    return sorted(_fields(tp))


def json_schema(kind: Any) -> dict:
    """The JSON Schema of an input file's schema (for the docs)."""
    return _adapter(kind).json_schema()
