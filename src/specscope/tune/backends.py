"""What a bench needs of an engine: the :class:`Backend` interface, the typed per-request result
(:class:`Decoded`, and :class:`Request` once the bench has labelled it), and the two backends that
run on the pair loaded in this process: specscope's decoder (:class:`SpecscopeBackend`) and
transformers' ``generate()``, plain or assisted (:class:`TransformersBackend`).

A backend knows how to run one prompt under one of its settings and how long that took; a
setting is a frozen dataclass of the backend's own (:class:`DecoderSetting`,
:class:`TransformersSetting`, llama-server's
:class:`~specscope.serving.llamacpp.server.ServerSetting`), compared by value so that two bench
methods decoding alike are timed once. The other backends: llama-server spawned and managed
(:mod:`specscope.serving.llamacpp.backend`) and an OpenAI-compatible server the user runs
(:mod:`specscope.serving.openai_server`).

This module does not loop over prompts, check held-out prompts or summarise
(:func:`specscope.tune.bench.run_bench` does), and does not choose settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Protocol

from ..core.loop import DecodeConfig
from ..drafters import DrafterConfig
from ..prompts.items import PromptItem
from ..trees import DynamicTree, TreeShape
from .hf_generate import hf_generate
from .predict import Stop


@dataclass(frozen=True)
class Prompt:
    """One held-out prompt as a backend receives it: the item, its token ids as rendered for the
    pair's tokenizer, and its text (what a server that tokenizes for itself is sent)."""

    item: PromptItem
    ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Decoded:
    """One prompt decoded under one setting, as the backend timed it. ``steps``: verification
    steps, the prefill's token one (plain: forward passes of the target); ``drafted`` and
    ``accepted``: draft tokens proposed and accepted (None: the engine does not say)."""

    output_ids: tuple[int, ...]
    steps: int
    drafted: int | None
    accepted: int | None
    time_s: float  # the prefill and the decoding
    first_token_s: float  # to the first step's tokens (the prefill)
    first_tokens: int = 1  # tokens that arrived then (assisted: the first step's)
    stop_type: str = ""

    @property
    def decode_s(self) -> float:
        """The time after the first step: the part speculation changes."""
        return self.time_s - self.first_token_s


@dataclass(frozen=True)
class Request(Decoded):
    """A :class:`Decoded` labelled by the bench: which method, prompt and repeat (the rows of a
    bench's checkpoint and of ``requests.parquet``)."""

    method: str = ""
    prompt_id: str = ""
    domain: str = ""
    repeat: int = 0
    routed_to: str = ""  # the routed method's domain for this prompt, else ""
    machine: str = ""  # hardware.machine_line of the machine that timed it

    @property
    def tokens(self) -> int:
        return len(self.output_ids)

    @classmethod
    def from_dict(cls, data: Mapping) -> Request:
        names = {f.name for f in fields(cls)}
        return cls(
            **{k: tuple(v) if k == "output_ids" else v for k, v in data.items() if k in names}
        )

    def to_dict(self) -> dict:
        return asdict(self)


def requests_frame(requests: Sequence[Request]):
    """Requests as a DataFrame, a row each (what ``requests.parquet`` holds)."""
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in requests])


# a backend's running engines for one bench session: (setting's name, prompt) -> its decoding
Runner = Callable[[str, Prompt], Decoded]


class Backend(Protocol):
    """An engine a bench times. ``settings`` holds what it was asked to run (by method name,
    possibly several names with one setting); ``session`` starts what those need (servers) and
    yields the runner; ``fresh_per_repeat``: every repeat needs a new session (an engine that
    keeps state across requests, such as llama-server's n-gram pool, would otherwise time
    another thing the second time); ``adaptive``: the engine's own adaptive mode, the baseline
    a chosen policy is measured against (None: it has none)."""

    name: str
    fresh_per_repeat: bool
    adaptive: object | None

    def session(self, settings: Mapping[str, object]) -> AbstractContextManager[Runner]: ...


@contextmanager
def no_session(run: Callable[[object, Prompt], Decoded], settings: Mapping) -> Iterator[Runner]:
    """The session of a backend that starts nothing: each name runs its setting in process."""
    yield lambda name, prompt: run(settings[name], prompt)


# --- specscope's decoder and transformers, on the pair loaded here ---------------------------------


@dataclass(frozen=True)
class DecoderSetting:
    """specscope's decoder drafting ``tree`` with ``drafter``; the drafter held resolved, so that
    two ways of naming one drafter compare equal."""

    drafter: DrafterConfig
    tree: TreeShape | DynamicTree | None
    stop: Stop | None = None  # a per-node stop rule (tune's, from the policy entry)

    def __post_init__(self) -> None:
        object.__setattr__(self, "drafter", self.drafter.resolved())


@dataclass(frozen=True)
class TransformersSetting:
    """transformers' ``generate()``: plain (no assistant), or assisted generation drafting a
    chain of ``tokens`` per step (None: transformers' own adaptive mode, its default: up to 20
    tokens stopped by a draft-confidence threshold it re-fits as it goes)."""

    assisted: bool = False
    tokens: int | None = None


PLAIN = TransformersSetting()
ASSISTED_ADAPTIVE = TransformersSetting(assisted=True)


@dataclass
class TransformersBackend:
    """transformers' greedy ``generate()`` of the pair loaded here; a step is a pass of the
    target (the prefill one), accepted tokens the rest."""

    target: object
    draft: object
    eos: frozenset[int]
    max_new_tokens: int
    name: str = "transformers"
    fresh_per_repeat: bool = False
    adaptive: TransformersSetting | None = ASSISTED_ADAPTIVE

    def run(self, s: TransformersSetting, prompt: Prompt) -> Decoded:
        g = hf_generate(
            self.target,
            list(prompt.ids),
            self.max_new_tokens,
            self.eos,
            self.draft if s.assisted else None,
            s.tokens,
        )
        accepted = max(len(g.tokens) - g.target_passes, 0) if s.assisted else 0
        return Decoded(
            tuple(g.tokens),
            g.target_passes,
            None if s.assisted else 0,
            accepted,
            g.time_s,
            g.first_token_s,
            g.first_tokens,
        )

    def session(self, settings: Mapping[str, TransformersSetting]):
        return no_session(self.run, settings)


@dataclass
class SpecscopeBackend:
    """specscope's decoder: ``decoder_for(drafter)`` is the pair's decoder drafting with it."""

    decoder_for: Callable[[DrafterConfig], object]
    config: DecodeConfig
    name: str = "specscope"
    fresh_per_repeat: bool = False
    adaptive: DecoderSetting | None = None  # --p-min is a setting of its own, not a default

    def run(self, s: DecoderSetting, prompt: Prompt) -> Decoded:
        t0 = time.perf_counter()
        cut = s.stop.decode_args if s.stop else {}
        r = self.decoder_for(s.drafter).generate(list(prompt.ids), s.tree, self.config, **cut)
        elapsed = time.perf_counter() - t0
        drafted = sum(x.tree_size for x in r.steps)
        accepted = sum(x.accepted_len for x in r.steps)
        return Decoded(
            tuple(r.tokens), len(r.steps), drafted, accepted, elapsed, r.steps[0].step_time_s
        )

    def session(self, settings: Mapping[str, DecoderSetting]):
        return no_session(self.run, settings)


@dataclass
class Engines:
    """Several in-process backends benched together (specscope's decoder beside transformers'
    plain and assisted generation), each setting run by the backend whose setting type it is."""

    by_kind: Mapping[type, SpecscopeBackend | TransformersBackend]
    fresh_per_repeat: bool = False

    @property
    def name(self) -> str:
        return "+".join(b.name for b in self.by_kind.values())

    @property
    def adaptive(self):
        return next((b.adaptive for b in self.by_kind.values() if b.adaptive is not None), None)

    def run(self, s, prompt: Prompt) -> Decoded:
        return self.by_kind[type(s)].run(s, prompt)

    def session(self, settings: Mapping[str, object]):
        return no_session(self.run, settings)
