"""Type checks of config values read from TOML, JSON or the command line, naming the field.

TOML and JSON give ``"no"``, ``4.5`` or ``"abc"`` where a bool or an int is wanted, and dataclasses
do not check: ``chat_template = "no"`` would count as true. :func:`check_fields` checks every field
of a config dataclass against its annotation before the dataclass is built, and raises the
caller's error class with the field's dotted name, the value and what is allowed.

Only the annotations configs use are understood: ``bool``, ``int``, ``float``, ``str``,
``X | None``, ``tuple[X, ...]`` and fixed tuples ``tuple[X, Y]``, and nested config dataclasses
(checked by their own ``from_dict``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache


@cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _describe(tp: object) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            plural = {str: "strings", int: "integers", float: "numbers", bool: "booleans"}
            return f"a list of {plural.get(args[0], 'items: ' + _describe(args[0]))}"
        return f"a list of {len(args)}: " + ", ".join(_describe(a) for a in args)
    if tp is type(None):
        return "none"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _fits(value: object, tp: object) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
    return True  # nested dataclasses and anything unannotated: checked elsewhere


def check_fields(cls: type, data: dict, error: type[Exception], section: str = "") -> None:
    """Raise ``error`` unless every value in ``data`` fits the annotation of ``cls``'s field."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        tp, value = hints[f.name], data[f.name]
        if dataclasses.is_dataclass(tp) or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
            continue
        if not _fits(value, tp):
            raise error(f"{section}{f.name} must be {_describe(tp)}, got {value!r}")
