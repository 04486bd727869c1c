"""The sweep file: a base run config and the axes of a grid, expanded into labelled grid points.

Reads and validates TOML; runs nothing. The grid's size (the product of its axes' lengths) is
computed before anything is expanded and a grid of more than ``max_points`` points is refused;
the grid is then expanded once (``SweepSpec.points``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..drafters import DrafterConfig, DrafterError
from ..errors import SpecscopeError
from ..files import read_toml_table
from ..limits import MAX_THREADS, out_of_range
from ..models import ModelLoadError, PairConfig
from ..run.config import PromptSpec, RunConfig, RunConfigError, load_config
from ..schemas import INPUT, parse
from ..trees import TreeConfig

SWEEP_MANIFEST = "sweep.json"
SWEEP_SCHEMA_VERSION = 1
MAX_GRID_POINTS = 10_000  # a larger grid is refused before it is expanded ([execution] max_points)
DIR_NAME_MAX = 200  # bytes of a run directory's name; a longer label gets a hashed name
RAY_EXTRA_HINT = "pip install 'specscope[ray]'"
AXES = {
    "pairs": "pair",
    "drafters": "drafter",
    "trees": "tree",
    "domains": "domain",
    "decode": "decode",
}  # file key: axis


class SweepError(SpecscopeError, ValueError):
    """A sweep file, directory or execution that cannot go on; the message says why."""


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_=,+" else "_" for c in name)


# --- the sweep file ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One value of one grid axis: a name and the run-config settings it applies."""

    name: str
    settings: tuple[tuple[str, Any], ...]  # ("tree.policy", "chain"), ("max_new_tokens", 32), ...


@dataclass(frozen=True)
class Execution:
    """How shards are cut and scheduled; none of it changes a record."""

    __pydantic_config__ = INPUT  # a sweep file's [execution] table (specscope.schemas)

    prompts_per_shard: int = 8
    max_retries: int = 3  # Ray retries of a shard whose worker died
    cpus_per_shard: float = 1.0  # Ray num_cpus of a shard
    gpus_per_shard: float | None = None  # Ray num_gpus of a cuda shard; None: one per cuda device
    threads: int | None = (
        None  # torch threads per shard; None: cpus_per_shard on Ray, default locally
    )
    max_points: int = MAX_GRID_POINTS  # the largest grid this sweep may expand
    batch_size: int | None = None  # prompts measured together; None: run's default for each point

    def __post_init__(self) -> None:
        if self.prompts_per_shard < 1:
            raise SweepError(f"prompts_per_shard must be >= 1, got {self.prompts_per_shard}")
        if self.max_retries < 0:
            raise SweepError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.cpus_per_shard <= 0:
            raise SweepError(f"cpus_per_shard must be > 0, got {self.cpus_per_shard}")
        if self.gpus_per_shard is not None and self.gpus_per_shard <= 0:
            raise SweepError(f"gpus_per_shard must be > 0, got {self.gpus_per_shard}")
        if self.threads is not None and (
            reason := out_of_range("threads", self.threads, 1, MAX_THREADS)
        ):
            raise SweepError(reason)
        if self.max_points < 1:
            raise SweepError(f"max_points must be >= 1, got {self.max_points}")
        if self.batch_size is not None and self.batch_size < 1:
            raise SweepError(f"batch_size must be >= 1, got {self.batch_size}")

    def replace(self, **overrides) -> Execution:
        """A copy with the given fields set (None values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class GridPoint:
    """One run of the sweep: its label, the variant chosen on each axis, and its config."""

    label: str
    axes: tuple[
        tuple[str, str], ...
    ]  # (axis, variant name), axis one of pair, drafter, tree, domain, decode
    config: RunConfig

    @property
    def dir_name(self) -> str:
        """The name of the point's run directory under ``runs/``: the label itself, or, where the
        label cannot be a directory name (longer than DIR_NAME_MAX bytes, or only dots), a
        readable prefix of it and a digest."""
        if len(self.label.encode()) <= DIR_NAME_MAX and self.label.strip("."):
            return self.label
        digest = hashlib.sha256(self.label.encode()).hexdigest()[:16]
        return f"{self.label[:64].strip('.') or 'point'}-{digest}"


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file: the base config and the variants of each axis."""

    name: str
    base: RunConfig
    pairs: tuple[Variant, ...] = ()
    drafters: tuple[Variant, ...] = ()
    trees: tuple[Variant, ...] = ()
    domains: tuple[Variant, ...] = ()
    decode: tuple[Variant, ...] = ()
    execution: Execution = field(default_factory=Execution)
    source: dict = field(default_factory=dict, compare=False)  # the file's contents
    trust_remote_code: bool = False  # the command line's choice, never the file's

    def points(self) -> list[GridPoint]:
        """The grid: every combination of one variant per given axis, in file order."""
        return list(self._points)

    @cached_property
    def _points(self) -> tuple[GridPoint, ...]:
        """The grid, expanded once."""
        axes = [(axis, getattr(self, axis)) for axis in AXES if getattr(self, axis)]
        points, seen = [], {}
        base = self.base.to_dict()
        for combo in itertools.product(*(variants for _, variants in axes)):
            label = ".".join(_safe(v.name) for v in combo) or "base"
            data = json.loads(json.dumps(base))
            for variant in combo:
                for key, value in variant.settings:
                    _set(data, key, value)
            try:
                config = RunConfig.from_dict(data, self.trust_remote_code, "the sweep file")
            except (RunConfigError, ModelLoadError, DrafterError, TypeError, ValueError) as e:
                raise SweepError(f"grid point {label}: {e}") from None
            if label in seen:
                raise SweepError(
                    f"two grid points are both labelled {label!r}; give the axis "
                    "entries distinct names"
                )
            seen[label] = config
            points.append(
                GridPoint(
                    label, tuple((AXES[key], v.name) for (key, _), v in zip(axes, combo)), config
                )
            )
        return tuple(points)

    @cached_property
    def sweep_id(self) -> str:
        text = json.dumps([(p.label, p.config.run_id) for p in self.points()])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _set(data: dict, key: str, value: Any) -> None:
    section, _, name = key.rpartition(".")
    target = data
    for part in section.split(".") if section else ():
        if not isinstance(target.get(part), dict):
            raise SweepError(f"setting {key}: {part!r} is not a section of the run config")
        target = target[part]
    target[name] = value


def _merge(data: dict, overrides: dict, where: str) -> dict:
    out = dict(data)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, f"{where}.{key}")
        elif key not in out:
            raise SweepError(f"[{where}]: unknown key {key!r}; allowed: {sorted(out)}")
        else:
            out[key] = value
    return out


SECTIONS = ("pair", "drafter", "tree", "prompts")  # run-config tables: axes, not decode settings
_SECTIONS = {
    "pairs": ("pair", PairConfig),
    "drafters": ("drafter", DrafterConfig),
    "trees": ("tree", TreeConfig),
    "domains": ("prompts", PromptSpec),
}


def _axis(axis: str, entries: list) -> tuple[Variant, ...]:
    """Variants of the pairs, trees or domains axis; list values expand into one variant each."""
    section, kind = _SECTIONS[axis]
    fields = {f.name: f for f in dataclasses.fields(kind)}
    if not entries:
        raise SweepError(
            f"{axis}: an empty list; give at least one entry, or leave the axis out "
            "to keep the base's"
        )
    variants = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str) and axis in ("drafters", "trees", "domains"):
            entry = {
                "drafters": {"kind": entry},
                "trees": {"policy": entry},
                "domains": {"name": entry, "domains": [entry]},
            }[axis]
        entry = dict(entry)
        name = entry.pop("name", None)
        unknown = sorted(set(entry) - set(fields))
        if unknown:
            raise SweepError(
                f"{axis}[{i}]: unknown keys {unknown}; allowed: name, {', '.join(fields)}"
            )
        if name is None:
            name = {
                "pairs": f"pair{i}",
                "drafters": str(entry.get("kind", f"drafter{i}")),
                "trees": str(entry.get("policy", f"tree{i}")),
            }.get(axis)
            if name is None:
                name = (
                    Path(entry["file"]).stem
                    if entry.get("file")
                    else "+".join(entry.get("domains", ())) or f"prompts{i}"
                )
        grid = [
            k for k, v in entry.items() if isinstance(v, list) and k not in ("domains", "sources")
        ]
        for k in grid:
            if not entry[k]:
                raise SweepError(f"{axis}[{i}].{k}: an empty list; give at least one value")
        for values in itertools.product(*(entry[k] for k in grid)):
            chosen = {**entry, **dict(zip(grid, values))}
            suffix = "".join(f"-{k}{v}" for k, v in zip(grid, values))
            if axis == "domains":  # a prompt set replaces the base's, keeping per_domain, sources
                chosen = {"file": None, "domains": [], "smoke": False, **chosen}
            if axis == "drafters":  # a drafter replaces the base's, parameters included
                chosen = {**dataclasses.asdict(DrafterConfig()), **chosen}
            settings = tuple((f"{section}.{k}", v) for k, v in chosen.items())
            variants.append(Variant(f"{name}{suffix}", settings))
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise SweepError(f"{axis}: two entries are both named {dup!r}; give each a distinct name")
    return tuple(variants)


def _variant_count(axis: str, entries: Any) -> int:
    """How many variants an axis of the sweep file expands into, counted without expanding it
    (an entry that is not a table counts once; :func:`_axis` and :func:`_decode` refuse it)."""
    if axis == "decode":
        if not isinstance(entries, dict):
            return 1
        return math.prod(len(v) if isinstance(v, list) else 1 for v in entries.values())
    if not isinstance(entries, list):
        return 1
    return sum(
        math.prod(
            len(v)
            for k, v in entry.items()
            if isinstance(v, list) and k not in ("name", "domains", "sources")
        )
        if isinstance(entry, dict)
        else 1
        for entry in entries
    )


def check_grid_size(data: dict, limit: int) -> int:
    """The number of grid points the sweep file describes (the product of its axes' lengths),
    refused above ``limit`` before anything is expanded."""
    size = math.prod(_variant_count(axis, data[axis]) for axis in AXES if axis in data)
    if size > limit:
        raise SweepError(
            f"the grid has {size:,} points, more than the limit of {limit:,}; "
            "shrink an axis, or raise the limit with [execution] max_points or "
            "--max-points"
        )
    return size


def _decode(table: dict) -> tuple[Variant, ...]:
    """The decode axis: the product of every setting's values (a scalar is one value)."""
    known = {f.name for f in dataclasses.fields(RunConfig)}
    for key in table:
        if key.partition(".")[0] not in known or key in SECTIONS:
            raise SweepError(
                f"[decode]: unknown setting {key!r}; use a run-config key "
                f"({', '.join(sorted(known - set(SECTIONS)))}) "
                "or section.key"
            )
    keys = list(table)
    values = [v if isinstance(v, list) else [v] for v in table.values()]
    for key, v in zip(keys, values):
        if not v:
            raise SweepError(f"[decode].{key}: an empty list; give at least one value")
    named = [k for k, v in zip(keys, values) if len(v) > 1]
    variants = []
    for combo in itertools.product(*values):
        chosen = dict(zip(keys, combo))
        name = ",".join(f"{k.rpartition('.')[2]}={str(chosen[k]).lower()}" for k in named)
        variants.append(Variant(name or "decode", tuple(chosen.items())))
    return tuple(variants)


class SweepFile(BaseModel):
    """A sweep file (TOML, docs/guides/sweep.md): its schema. Each axis is a list of entries
    (a table of its run-config section's keys, a list value making one variant per value, or
    a name); the values are checked as run configs at every grid point."""

    model_config = INPUT
    name: str | None = None  # default: the file's name
    base: str | None = None  # a preset, a config file or a run's manifest.json
    defaults: dict[str, Any] = {}  # run-config keys over the base's
    execution: Execution = Execution()
    pairs: list[dict[str, Any]] | None = None
    drafters: list[str | dict[str, Any]] | None = None
    trees: list[str | dict[str, Any]] | None = None
    domains: list[str | dict[str, Any]] | None = None
    decode: dict[str, Any] | None = None  # run-config key (or section.key) -> value or values


def parse_sweep(
    data: dict, name: str = "sweep", max_points: int | None = None, trust_remote_code: bool = False
) -> SweepSpec:
    """A sweep spec from the parsed contents of a sweep file.

    ``trust_remote_code`` is the command line's choice: a sweep file asking for remote code gets
    a warning and is ignored (:func:`specscope.run.config.remote_code_from_command_line`).

    ``max_points`` (default: ``[execution] max_points``, else MAX_GRID_POINTS): a grid of more
    points is refused before it is expanded.
    """
    read = parse(SweepFile, data, "the sweep file", SweepError)
    try:
        base = load_config(read.base)
        base = RunConfig.from_dict(
            _merge(base.to_dict(), read.defaults, "defaults"), trust_remote_code, "the sweep file"
        )
    except (RunConfigError, ModelLoadError, TypeError, ValueError) as e:
        raise SweepError(f"base config: {e}") from None
    execution = read.execution.replace(max_points=max_points)
    check_grid_size(data, execution.max_points)
    axis = {a: _axis(a, getattr(read, a)) for a in _SECTIONS if getattr(read, a) is not None}
    spec = SweepSpec(
        name=read.name or name,
        base=base,
        **axis,
        decode=_decode(read.decode) if read.decode is not None else (),
        execution=execution,
        source=data,
        trust_remote_code=trust_remote_code,
    )
    spec.points()  # every grid point must be a valid run config
    return spec


def load_sweep(
    path: str | Path, max_points: int | None = None, trust_remote_code: bool = False
) -> SweepSpec:
    """Read and check a sweep file (TOML); the error names what is wrong."""
    path = Path(path)
    data = read_toml_table(path, SweepError, "sweep file")
    try:
        return parse_sweep(
            data, name=path.stem, max_points=max_points, trust_remote_code=trust_remote_code
        )
    except SweepError as e:
        raise SweepError(f"{path}: {e}") from None
