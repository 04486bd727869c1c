"""What determines a run's records: :class:`RunConfig` (pair, tree, prompts, engine, budgets,
seed, certificates), its content hash (the run id), presets and TOML/manifest loading.

Validates every field on construction; loads no model and reads no prompt.

Nothing read from a file enables code execution: ``pair.trust_remote_code`` comes only from the
command line (``--trust-remote-code``). A config, sweep file or run manifest asking for it (a run
directory may come from anyone) gets one warning on stderr and is treated as false
(:func:`remote_code_from_command_line`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..drafters import DrafterConfig, DrafterError
from ..errors import SpecscopeError
from ..files import read_json, read_toml_table
from ..limits import MAX_PROMPTS, MAX_SEED, MAX_TOKENS, out_of_range
from ..models import PairConfig
from ..progress import current
from ..prompts.items import (
    SMOKE_PROMPTS,
    PromptItem,
    PromptSourceError,
    read_jsonl,
    sample_items,
)
from ..prompts.render import RENDERINGS
from ..schemas import INPUT, parse
from ..theory import CriteriaConfig
from ..trees import TreeConfig

PRESETS = ("paper", "demo")
ENGINES = ("cached", "naive")  # how measurement scores a step: KV caches and one tree pass, or
#                               the paper's full recompute (specscope.measure.naive)


# [pair] fields that a run's id names only when set, so that a run not setting them keeps the id
# it had before they existed (shipped results among them)
_PAIR_HASHED_WHEN_SET = ("draft_revision", "target_revision")


class RunConfigError(SpecscopeError, ValueError):
    """A run config that cannot be used; the message names the field and what is allowed."""


_WARNED: set[str] = set()  # each file's request for remote code is warned about once


def remote_code_from_command_line(pair: dict, given: bool, where: str) -> dict:
    """``pair`` (a [pair] section read from ``where``) with ``trust_remote_code`` set to ``given``,
    the command line's choice; a section asking for remote code that the command line did not
    allow gets one warning on stderr naming the flag."""
    if pair.get("trust_remote_code") is True and not given and where not in _WARNED:
        _WARNED.add(where)
        current().note(
            f"warning: {where} asks for trust_remote_code; ignored: model code from a file "
            "never runs, give --trust-remote-code on the command line to allow it",
            "warning",
        )
    return {**pair, "trust_remote_code": given}


@dataclass(frozen=True)
class PromptSpec:
    """Which prompts to measure: a JSONL file, the built-in smoke set, or domain sources."""

    __pydantic_config__ = INPUT  # a config file's [prompts] table (specscope.schemas)

    file: str | None = None
    domains: tuple[str, ...] = ()
    per_domain: int | None = None
    sources: tuple[tuple[str, str], ...] = ()  # (domain, source name) overrides
    smoke: bool = False

    def __post_init__(self) -> None:
        if self.per_domain is not None and self.per_domain > MAX_PROMPTS:
            raise RunConfigError(
                f"per_domain must be in 1..{MAX_PROMPTS} (prompts per domain), got {self.per_domain}"
            )

    def select(self, seed: int) -> list[PromptItem]:
        if self.smoke:
            return list(SMOKE_PROMPTS)
        if self.file:
            domain = self.domains[0] if len(self.domains) == 1 else None
            items = read_jsonl(self.file, domain=domain)
            if self.per_domain is None:
                return items
            by_domain: dict[str, list[PromptItem]] = {}
            for item in items:
                by_domain.setdefault(item.domain, []).append(item)
            return [
                x
                for group in by_domain.values()
                for x in sample_items(group, self.per_domain, seed)
            ]
        if self.domains:
            from ..prompts.domains import select_prompts

            return select_prompts(
                list(self.domains), self.per_domain, seed=seed, sources=dict(self.sources) or None
            )
        raise PromptSourceError("no prompts: give --prompts FILE, --domains or --smoke")


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's records: a config file's schema (its sections are the
    nested dataclasses; :mod:`specscope.schemas` checks every value's type on read)."""

    __pydantic_config__ = INPUT

    pair: PairConfig = field(default_factory=PairConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    prompts: PromptSpec = field(default_factory=PromptSpec)
    engine: str = "cached"
    max_new_tokens: int = 64
    max_prompt_tokens: int = 512
    rendering: str = "task"  # how prompts become text: specscope.prompts.render.RENDERINGS
    seed: int = 42
    criteria: CriteriaConfig | None = field(default_factory=CriteriaConfig)  # None: no certificates
    drafter: DrafterConfig = field(default_factory=DrafterConfig)

    def __post_init__(self) -> None:
        if not self.drafter.has_distribution:  # certificates compare p with the draft's q
            object.__setattr__(self, "criteria", None)
        if self.drafter.spec.chain_only:  # the check decode makes too, on the tree's shape
            try:
                shape = self.tree.shape()
                self.drafter.check_chain(shape.is_chain, len(shape))
            except DrafterError as e:
                raise RunConfigError(f"{e} (tree policy {self.tree.policy!r})") from None
        if self.engine not in ENGINES:
            raise RunConfigError(
                f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}"
            )
        for name, low, high in (
            ("max_new_tokens", 1, MAX_TOKENS),
            ("max_prompt_tokens", 1, MAX_TOKENS),
            ("seed", 0, MAX_SEED),
        ):
            reason = out_of_range(name, getattr(self, name), low, high)
            if reason:
                raise RunConfigError(reason)
        if self.rendering not in RENDERINGS:
            raise RunConfigError(
                f"unknown rendering {self.rendering!r}; allowed: {', '.join(RENDERINGS)}"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def run_id(self) -> str:
        """A content hash of the config: the same config always gives the same id."""
        data = self.to_dict()
        if self.drafter == DrafterConfig():  # runs of the draft model keep their ids
            del data["drafter"]
        for name in _PAIR_HASHED_WHEN_SET:
            if data["pair"][name] is None:
                del data["pair"][name]
        text = json.dumps(data, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @classmethod
    def from_dict(
        cls, data: dict, trust_remote_code: bool = False, where: str = "the config"
    ) -> RunConfig:
        """A config from TOML- or JSON-like data read from ``where``; every value's type is
        checked, by field. ``pair.trust_remote_code`` is ``trust_remote_code`` (the command
        line's choice) whatever the data says (:func:`remote_code_from_command_line`)."""
        data = dict(data)
        if "chat_template" in data:  # configs written before renderings: chat or raw
            legacy = data.pop("chat_template")
            if not isinstance(legacy, bool):
                raise RunConfigError(
                    f"chat_template must be true or false, got {legacy!r} "
                    '(or use rendering = "task", "chat" or "raw")'
                )
            data["rendering"] = "chat" if legacy else "raw"
        if isinstance(data.get("pair"), dict):
            data["pair"] = remote_code_from_command_line(data["pair"], trust_remote_code, where)
        elif "pair" not in data and trust_remote_code:
            data["pair"] = {"trust_remote_code": True}
        return parse(cls, data, where, RunConfigError)

    def replace(self, **overrides) -> RunConfig:
        """A copy with top-level or ``section.key`` overrides (None values are ignored); an
        override ``pair.trust_remote_code`` is the command line's choice."""
        data = self.to_dict()
        for key, value in overrides.items():
            if value is None:
                continue
            section, _, name = key.rpartition(".")
            (data[section] if section else data)[name] = value
        return RunConfig.from_dict(data, data["pair"]["trust_remote_code"], where="")


def load_config(source: str | Path | None) -> RunConfig:
    """A config from a preset name (``paper``, ``demo``), a TOML file, a run's
    ``manifest.json`` (its recorded config, to measure more like it), or the defaults."""
    if source is None:
        return RunConfig()
    if str(source) in PRESETS:
        text = resources.files("specscope").joinpath("presets", f"{source}.toml").read_text()
        data = tomllib.loads(text)
    else:
        path = Path(source)
        if not path.is_file():
            raise RunConfigError(
                f"config {source} is neither a preset ({', '.join(PRESETS)}) "
                "nor a TOML file or a run's manifest.json"
            )
        if path.suffix == ".json":
            manifest = read_json(path, RunConfigError, "config")
            if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
                raise RunConfigError(f"{source}: not a run manifest (it has no 'config' object)")
            data = manifest["config"]
        else:
            data = read_toml_table(path, RunConfigError, "config")
    try:
        return RunConfig.from_dict(data, where=str(source))
    except TypeError as e:
        raise RunConfigError(f"{source}: {e}") from None
