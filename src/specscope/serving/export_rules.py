"""What each engine version accepts, as data: field rules, cross-field rules and provenance.

An :class:`EngineVersion` names the engine release (or source snapshot) it describes, the engine
files and commits its rules were read from (``checked_against``), the fields the engine takes with
their allowed values, whether the engine refuses fields it does not know, and the rules that tie
fields together (length and budget rules). :meth:`EngineVersion.validate` checks one setting
against them; every exporter runs it on its own output before returning it.

This module knows nothing of policies, trees or routing; it only checks settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import SpecscopeError


class ExportError(SpecscopeError, ValueError):
    """A policy that the chosen engine cannot express, an unknown engine version, or a missing
    export option."""


@dataclass(frozen=True)
class Field:
    """One field an engine takes: its type and allowed values."""

    name: str
    kind: type | tuple[type, ...]
    low: float | None = None  # inclusive bounds for numbers
    high: float | None = None
    choices: tuple = ()  # allowed values, if the engine has a closed set
    required: bool = False

    def check(self, value) -> str | None:
        """Why ``value`` is not allowed, or None."""
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        if isinstance(value, bool) and bool not in kinds:
            return f"must be {'/'.join(k.__name__ for k in kinds)}, got {value!r}"
        if not isinstance(value, kinds):
            return f"must be {'/'.join(k.__name__ for k in kinds)}, got {value!r}"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                return f"must be finite, got {value!r}"
            if self.low is not None and value < self.low:
                return f"must be >= {self.low}, got {value!r}"
            if self.high is not None and value > self.high:
                return f"must be <= {self.high}, got {value!r}"
        return None


@dataclass(frozen=True)
class Rule:
    """A rule between fields: ``holds(setting)`` is False when the setting breaks it."""

    text: str  # the rule as the engine states it
    holds: Callable[[dict], bool]


@dataclass(frozen=True)
class EngineVersion:
    """One engine version's rules for the settings specscope exports, and where they come from."""

    engine: str
    version: str
    checked_against: tuple[str, ...]  # "owner/repo:path@commit"
    fields: tuple[Field, ...]
    forbid_extra: bool  # the engine refuses fields it does not know
    rules: tuple[Rule, ...] = ()
    notes: tuple[str, ...] = ()  # what a user must know (refusals, approximations)
    approximation: str | None = None  # set when the engine approximates the exported shape
    about: str = ""  # what the version names (the engines table)
    tree_reason: str = ""  # why a tree with branches is refused, for chain-only versions
    drafters: tuple[str, ...] = ("draft-model",)  # specscope drafters exported to its own method
    field_names: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "field_names", {f.name: f for f in self.fields})

    def validate(self, setting: dict, where: str) -> dict:
        """``setting`` unchanged if this version accepts it, else an :class:`ExportError` naming
        the field (or rule) and what is allowed."""
        label = f"{where}: {self.engine} {self.version}"
        for name, value in setting.items():
            rule = self.field_names.get(name)
            if rule is None:
                if self.forbid_extra:
                    raise ExportError(
                        f"{label} refuses field {name!r}; allowed: {', '.join(self.field_names)}"
                    )
                continue
            reason = rule.check(value)
            if reason:
                raise ExportError(f"{label}: {name} {reason}")
        missing = [f.name for f in self.fields if f.required and f.name not in setting]
        if missing:
            raise ExportError(f"{label}: missing required field(s) {', '.join(missing)}")
        for rule in self.rules:
            if not rule.holds(setting):
                raise ExportError(f"{label}: breaks the rule {rule.text}")
        return setting


@dataclass(frozen=True)
class Engine:
    """An exporter: its checked versions (newest first) and the function that writes a document."""

    name: str
    versions: tuple[EngineVersion, ...]
    export: Callable  # (PolicyPlan, ExportOptions, EngineVersion) -> dict
    exports: str  # the engines table: what is exported
    refuses: str  # the engines table: what is refused and why

    def version(self, requested: str | None) -> EngineVersion:
        if requested is None:
            return self.versions[0]
        for v in self.versions:
            if v.version == requested:
                return v
        raise ExportError(
            f"{self.name} version {requested!r} was not checked; checked: "
            f"{', '.join(v.version for v in self.versions)} (--engine-version)"
        )
