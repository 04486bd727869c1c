"""Which speculation to use: policy names as trees (``make_speculation``), the tree of best
predicted speed-up per domain (``tune``), and that choice as a validated JSON or TOML file
(:class:`PolicyFile`).

``tune`` predicts a tree's tokens per step with :class:`.predict.Predictor`: by replaying the
measurement's recorded trees as greedy decoding for every tree they hold, and from the
acceptance vector only for a tree deeper or wider than measured. A tuned domain entry says which
(``"prediction": {"tokens_per_step": 3.61, "interval": [3.55, 3.68], "method": "replay"}``, or
``"method": "extrapolated (acceptance vector)"`` with no interval); files without it still read.

A policy file's domain entry is ``{"tree": ...}`` with, for a drafter other than the draft model,
``"drafter": {"kind": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}`` (or
``{"kind": "early-exit", "exit_layer": 8}``); no ``drafter`` means the draft model, so files
written before drafters existed read, and are written, unchanged. ``"backend": "transformers"``
says the entry's chain is predicted fastest in transformers' assisted generation (:data:`BACKENDS`);
no ``backend`` means specscope's decoder.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ConfigDict

from ..analysis.replay import ReplayRecords, shape_label
from ..drafters.config import DrafterConfig, DrafterError
from ..files import read_json_object, read_toml_table, write_json
from ..prompts.domains import DOMAINS
from ..schemas import INPUT, parse
from ..trees import DynamicTree, Speculation, TreeConfig, TreeConfigError, TreeShape
from .acceptance import (
    ALL_DOMAINS,
    AcceptanceVector,
    PolicyError,
    acceptance_vectors,
    chain_acceptance,
)
from .costs import CostModel
from .optimal import build_paths, forest_tables, optimal_tree
from .predict import Prediction, PredictionRecord, Predictor
from .routed import ROUTER, Destination, routed_predictions

POLICY_FORMAT = "specscope-policy/1"

# what decodes a policy entry: the backends tune prices and the bench runs
BACKENDS = {
    "specscope": "specscope's decoder (any drafter and tree)",
    "transformers": "transformers' assisted generation (a chain of K drafted by the draft model)",
}

# --- dynamic trees -------------------------------------------------------------------------------


short_name = shape_label  # ``none``, ``chain(4)`` or nodes per depth, e.g. ``tree 2/4/2``


def describe(spec: Speculation) -> str:
    if spec is None:
        return "none"
    if isinstance(spec, DynamicTree):
        return f"dynamic(N={spec.max_nodes}, D={spec.depth}, k={spec.top_k})"
    return f"{len(spec)} nodes, depth {spec.max_depth}: {spec.to_paths_literal()}"


def make_speculation(
    policy: str,
    *,
    depth: int | None = None,
    top_k: int | None = None,
    branch: int | None = None,
    max_nodes: int | None = None,
    paths: str | None = None,
    acceptance: AcceptanceVector | None = None,
) -> Speculation:
    """A policy name and its parameters (None: the policy's default) as a tree shape, a
    dynamic-growth config, or None (no speculation)."""
    if policy not in SPECULATIONS:
        raise PolicyError(f"unknown policy {policy!r}; choose one of {', '.join(SPECULATIONS)}")
    given = {
        k: v
        for k, v in dict(depth=depth, top_k=top_k, branch=branch, max_nodes=max_nodes).items()
        if v is not None
    }
    try:
        return SPECULATIONS[policy](policy, given, paths, acceptance)
    except TreeConfigError as e:
        raise PolicyError(str(e)) from None


def _static_tree(policy: str, given: dict, paths: str | None, acceptance) -> TreeShape:
    if policy == "chain":
        given.setdefault("depth", 4)
    return TreeConfig(policy=policy, paths=paths, **given).shape()


def _dynamic_tree(policy: str, given: dict, paths: str | None, acceptance) -> DynamicTree:
    given.pop("branch", None)
    return DynamicTree(**given)


def _optimal_tree(
    policy: str, given: dict, paths: str | None, acceptance: AcceptanceVector | None
) -> TreeShape:
    if acceptance is None:
        raise PolicyError("policy 'optimal' needs an acceptance vector (a run directory)")
    tree = optimal_tree(acceptance, given.get("max_nodes", 16), given.get("depth", 6))
    if tree.shape is None:
        raise PolicyError("the acceptance vector accepts nothing: no tree helps")
    return tree.shape


# policy name -> builder(policy, given options, paths, acceptance vector)
SPECULATIONS = {
    "chain": _static_tree,
    "static": _static_tree,
    "paper": _static_tree,
    "paper-text": _static_tree,
    "dynamic": _dynamic_tree,
    "optimal": _optimal_tree,
    "none": lambda *_: None,
}


# --- tuning ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """The tree chosen for one domain, the drafter that proposes it, and its predicted figures."""

    shape: TreeShape | None
    expected_tau: float
    predicted_speedup: float
    step_time_s: float
    drafter: DrafterConfig = DrafterConfig()  # what proposes the tree
    prediction: Prediction | None = None  # how expected_tau was predicted (None: no tree)
    backend: str = "specscope"  # what decodes it (BACKENDS)

    def to_dict(self) -> dict:
        return {
            "tree": self.shape.to_paths_literal() if self.shape else "none",
            "nodes": len(self.shape) if self.shape else 0,
            "expected_tau": round(self.expected_tau, 4),
            "predicted_speedup": round(self.predicted_speedup, 4),
            "step_time_s": round(self.step_time_s, 6),
            **({"prediction": self.prediction.to_dict()} if self.prediction else {}),
            **({"backend": self.backend} if self.backend != "specscope" else {}),
        }


def best_tree(
    acc: AcceptanceVector,
    costs: CostModel,
    max_nodes: int = 32,
    max_depth: int = 8,
    max_rank: int | None = None,
    min_speedup: float = 1.0,
    drafter: DrafterConfig = DrafterConfig(),
    proposal_rate: float = 1.0,
    predict: Callable[[TreeShape], Prediction] | None = None,
) -> Choice:
    """Over every node budget and depth limit, the optimal tree (under ``acc``) of best predicted
    speed-up (for a chain-only drafter, the best chain); no speculation (``shape=None``) unless
    some tree beats ``min_speedup``. ``predict``: a tree's predicted tokens per step and
    proposal rate (:meth:`.predict.Predictor.predict`); without it, ``acc``'s expected tau and
    ``proposal_rate`` (the fraction of steps in which the drafter proposes), unlabelled."""
    best = Choice(None, 1.0, 1.0, costs.plain_token_s)
    depth_limit = min(max_depth, acc.max_depth)
    for shape in _candidates(acc, max_nodes, depth_limit, max_rank, drafter.spec.chain_only):
        try:  # llama.cpp's ngram-simple never drafts with a chain shorter than its n-gram
            drafter.check_chain(shape.is_chain, len(shape))
        except DrafterError:
            continue
        prediction = predict(shape) if predict else None
        tau = prediction.tokens_per_step if prediction else acc.expected_tau(shape)
        rate, share = prediction.speed_terms() if prediction else (tau, proposal_rate)
        step = costs.step_time(shape, share)
        speedup = rate / step * costs.plain_token_s
        if speedup > max(best.predicted_speedup, min_speedup):
            best = Choice(shape, tau, speedup, step, drafter, prediction)
    return best


def _candidates(acc, max_nodes: int, depth_limit: int, max_rank: int | None, chains: bool):
    """The trees tuning weighs: chains of every depth, or each depth's optimal trees by size."""
    if chains:
        for depth in range(1, min(depth_limit, max_nodes) + 1):
            yield TreeShape.chain(depth)
        return
    for depth in range(1, depth_limit + 1):
        rank = min(max_rank or acc.max_rank, acc.max_rank)
        tables, take = forest_tables(acc, max_nodes, depth, rank)
        seen: set[tuple] = set()
        for n in range(1, max_nodes + 1):
            paths: list[tuple[int, ...]] = []
            build_paths(take, 1, n, (), rank, paths)
            if not paths or tuple(paths) in seen:
                continue
            seen.add(tuple(paths))
            yield TreeShape.from_paths(paths)


def best_assisted(
    costs: CostModel,
    max_depth: int,
    min_speedup: float,
    predict: Callable[[TreeShape], Prediction],
    holds: Callable[[TreeShape], bool],
) -> Choice:
    """The chain of best predicted speed-up in transformers' assisted generation (a draft
    model's, priced by ``costs.assisted_step_s``), among those the records hold; no
    speculation unless one beats ``min_speedup``."""
    best = Choice(None, 1.0, 1.0, costs.plain_token_s, backend="transformers")
    for depth in range(1, max_depth + 1):
        shape = TreeShape.chain(depth)
        if not holds(shape):
            break
        prediction = predict(shape)
        step = costs.assisted_step_time(depth)
        speedup = prediction.speed_terms()[0] / step * costs.plain_token_s
        if speedup > max(best.predicted_speedup, min_speedup):
            best = Choice(
                shape,
                prediction.tokens_per_step,
                speedup,
                step,
                prediction=prediction,
                backend="transformers",
            )
    return best


@dataclass(frozen=True)
class TuneConfig:
    max_nodes: int = 32
    max_depth: int = 8
    max_rank: int | None = None
    min_count: int = 20
    min_speedup: float = 1.0  # a domain speculates only if its best tree is predicted faster
    extrapolate: bool = False  # depths past the measured ones reuse the deepest measured rates

    def __post_init__(self) -> None:
        if self.max_nodes < 1 or self.max_depth < 1:
            raise PolicyError("tune needs max_nodes >= 1 and max_depth >= 1")
        if self.max_rank is not None and self.max_rank < 1:
            raise PolicyError(f"tune needs max_rank >= 1 (or none), got {self.max_rank}")
        if self.min_count < 0:
            raise PolicyError(f"tune needs min_count >= 0, got {self.min_count}")
        if not 0 <= self.min_speedup < float("inf"):  # NaN fails too
            raise PolicyError(f"tune needs a finite min_speedup >= 0, got {self.min_speedup}")


@dataclass(frozen=True)
class Measured:
    """What tuning weighs for one drafter: its measurement run's records and the cost model of
    decoding with it on this hardware."""

    drafter: DrafterConfig
    nodes: pd.DataFrame  # may be empty for a chain-only drafter: its steps say it all
    steps: pd.DataFrame
    costs: CostModel
    # prompt id -> the text a router reads (the user turns), for the routed prediction
    texts: Mapping[str, str] = field(default_factory=dict)

    def acceptance(self, min_count: int) -> dict[str, AcceptanceVector]:
        """Per domain (and pooled): the acceptance vector that proposes candidate trees and
        extrapolates past the measured ones: a run that measured chains (every chain-only
        drafter's) from its step records (:func:`chain_acceptance`), a tree's from node
        records (:func:`acceptance_vectors`)."""
        if self.drafter.spec.chain_only or (self.nodes["sibling_rank"] == 0).all():
            return chain_acceptance(self.steps, min_count)
        return acceptance_vectors(self.nodes, min_count)

    def vectors(self, config: TuneConfig) -> dict[str, AcceptanceVector]:
        """:meth:`acceptance` at ``config.min_count``, extended to ``config.max_depth`` where
        ``config.extrapolate`` says so: what tune weighs for this drafter."""
        vectors = self.acceptance(config.min_count)
        if config.extrapolate:
            vectors = {k: v.extrapolated(config.max_depth) for k, v in vectors.items()}
        return vectors

    def predictor(
        self, vectors: dict[str, AcceptanceVector], backend: str = "specscope"
    ) -> Predictor:
        """Tokens per step by replay of these records, ``vectors`` past them, with steps counted
        as ``backend`` decodes and the bench counts them, so that a prediction is checked on the
        count it predicts: specscope's decoder makes the prefill a plain one-token step,
        transformers' assisted generation drafts from the prompt in its first pass."""
        records = ReplayRecords.from_frames(self.nodes, self.steps)
        return Predictor(records, vectors, prefill_drafts=backend == "transformers")

    def assisted_predictor(self, vectors: dict[str, AcceptanceVector]) -> Predictor | None:
        """:meth:`predictor` for transformers' assisted generation, where the cost model timed
        it (a draft model's); else None."""
        return self.predictor(vectors, "transformers") if self.costs.assisted_step_s else None


def chain_candidates(
    m: Measured,
    predictor: Predictor,
    config: TuneConfig,
    vectors: dict[str, AcceptanceVector],
    assisted: Predictor | None = None,
) -> list[dict]:
    """Every chain of ``m``'s drafter that its records hold, up to ``config.max_depth``, in
    every domain: the predicted tokens per step (replayed, with its interval) and speed-up, so
    that a bench of any chain (not only the chosen ones) is set against a prediction made when
    the policy was tuned; with ``assisted`` (the replay as transformers counts steps), each chain
    in transformers' assisted generation too. Written to the policy file as ``candidates``."""
    out = []
    for depth in range(1, config.max_depth + 1):
        shape = TreeShape.chain(depth)
        try:
            m.drafter.check_chain(True, depth)
        except DrafterError:
            continue
        if not predictor.records.holds(shape):
            break
        for domain in vectors:
            mine = predictor.with_interval(shape, domain)
            priced = [("specscope", mine, m.costs.step_time(shape, mine.speed_terms()[1]))]
            if assisted is not None:
                theirs = assisted.with_interval(shape, domain)
                priced.append(("transformers", theirs, m.costs.assisted_step_time(depth)))
            for backend, prediction, step in priced:
                out.append(
                    {
                        "domain": domain,
                        "drafter": m.drafter.table,
                        "tree": shape.to_paths_literal(),
                        **({"backend": backend} if backend != "specscope" else {}),
                        "prediction": prediction.to_dict(),
                        "predicted_speedup": round(
                            prediction.speed_terms()[0] / step * m.costs.plain_token_s, 4
                        ),
                        "step_time_s": round(step, 6),
                    }
                )
    return out


def tune(
    measured: Sequence[Measured],
    config: TuneConfig = TuneConfig(),
    source: dict | None = None,
) -> PolicyFile:
    """Per domain (and pooled: the uniform tree), the drafter, tree and backend of best predicted
    speed-up over every measured drafter (the first listed wins a tie) in specscope's decoder and,
    for a draft model whose cost model timed it, in transformers' assisted generation; each
    chosen tree's prediction carries its interval (replayed) or says it is extrapolated."""
    if not measured:
        raise PolicyError("tune needs at least one measurement run")
    labels = [m.drafter.label for m in measured]
    if len(set(labels)) < len(labels):
        raise PolicyError(f"tune got two runs of one drafter: {', '.join(labels)}")
    choices: dict[str, Choice] = {}
    vector: dict[str, AcceptanceVector] = {}  # the chosen drafter's (the first's if none pays)
    predictors: dict[str, Predictor] = {}  # per domain: the chosen drafter's
    costs: dict[str, CostModel] = {}  # per domain: the chosen drafter's
    candidates: list[dict] = []
    population = None  # the first run's records: the tuning prompts a route is predicted on
    for m in measured:
        vectors = m.vectors(config)
        predictor = m.predictor(vectors)
        population = population or predictor.records
        assisted = m.assisted_predictor(vectors)
        candidates += chain_candidates(m, predictor, config, vectors, assisted)
        for name, acc in vectors.items():
            choice = best_tree(
                acc,
                m.costs,
                config.max_nodes,
                config.max_depth,
                config.max_rank,
                config.min_speedup,
                m.drafter,
                predict=functools.partial(predictor.predict, domain=name),
            )
            chosen_by = predictor
            if assisted is not None:
                theirs = best_assisted(
                    m.costs,
                    config.max_depth,
                    config.min_speedup,
                    functools.partial(assisted.predict, domain=name),
                    assisted.records.holds,
                )
                if theirs.predicted_speedup > choice.predicted_speedup:
                    choice, chosen_by = theirs, assisted
            if name not in choices or choice.predicted_speedup > choices[name].predicted_speedup:
                choices[name], vector[name], predictors[name] = choice, acc, chosen_by
                costs[name] = m.costs
    for name, choice in choices.items():
        if choice.shape is not None:
            interval = predictors[name].with_interval(choice.shape, name)
            choices[name] = dataclasses.replace(choice, prediction=interval)
    texts = {k: v for m in measured for k, v in m.texts.items()}
    routed = routed_predictions(
        population,
        texts,
        {
            name: Destination(c.shape, predictors[name], costs[name], c.backend)
            for name, c in choices.items()
        },
    )
    uniform = choices.pop(ALL_DOMAINS)
    drafters = {d: c.drafter for d, c in choices.items() if c.drafter != DrafterConfig()}
    backends = {d: c.backend for d, c in choices.items() if c.shape and c.backend != "specscope"}
    info = {
        "cost_model": measured[0].costs.to_dict(),
        "tune": dict(vars(config)),
        "acceptance": {k: v.to_dict() for k, v in vector.items()},
        "source": source or {},
    }
    if len(measured) > 1:
        info["cost_models"] = {m.drafter.label: m.costs.to_dict() for m in measured}
    info["candidates"] = candidates
    if routed:
        info["routed"] = {
            "router": ROUTER,
            "domains": {d: r.to_dict() for d, r in routed.items()},
        }
    return PolicyFile(
        trees={d: c.shape for d, c in choices.items()},
        uniform=uniform.shape,
        choices={**choices, ALL_DOMAINS: uniform},
        info=info,
        drafters=drafters,
        uniform_drafter=uniform.drafter,
        backends=backends,
        uniform_backend=uniform.backend if uniform.shape else "specscope",
    )


# --- policy files ----------------------------------------------------------------------------------


@dataclass
class PolicyFile:
    """Per-domain trees (None: no speculation) and the uniform tree for any other domain, each
    with the drafter that proposes it (not listed in ``drafters``: the draft model)."""

    trees: dict[str, TreeShape | None]
    uniform: TreeShape | None = None
    choices: dict[str, Choice] = field(default_factory=dict)  # predicted figures, if tuned
    info: dict = field(default_factory=dict)
    drafters: dict[str, DrafterConfig] = field(default_factory=dict)
    uniform_drafter: DrafterConfig = DrafterConfig()
    predictions: dict[str, Prediction] = field(default_factory=dict)  # read back from a file
    backends: dict[str, str] = field(default_factory=dict)  # not listed: specscope's decoder
    uniform_backend: str = "specscope"

    def __post_init__(self) -> None:
        for domain, drafter in self.drafters.items():
            if domain not in self.trees:
                raise PolicyError(
                    f"domain {domain!r} has a drafter ({drafter.label}) but no tree; "
                    f"domains with trees: {', '.join(self.trees) or 'none'}"
                )
            check_drafter(f"domain {domain!r}", self.trees[domain], drafter)
        check_drafter("uniform", self.uniform, self.uniform_drafter)
        for domain, backend in self.backends.items():
            check_backend(
                f"domain {domain!r}",
                self.trees.get(domain),
                self.drafters.get(domain, DrafterConfig()),
                backend,
            )
        check_backend("uniform", self.uniform, self.uniform_drafter, self.uniform_backend)

    def tree_for(self, domain: str) -> TreeShape | None:
        return self.trees.get(domain, self.uniform)

    def drafter_for(self, domain: str) -> DrafterConfig:
        """The drafter of ``domain``'s tree (the uniform tree's for a domain not listed)."""
        if domain in self.trees:
            return self.drafters.get(domain, DrafterConfig())
        return self.uniform_drafter

    def backend_for(self, domain: str) -> str:
        """What decodes ``domain``'s tree (:data:`BACKENDS`; the uniform tree's for a domain not
        listed)."""
        if domain in self.trees:
            return self.backends.get(domain, "specscope")
        return self.uniform_backend

    def to_dict(self) -> dict:
        def entry(name: str, shape: TreeShape | None, drafter: DrafterConfig, backend: str) -> dict:
            if name in self.choices:
                written = self.choices[name].to_dict()
            else:
                written = {"tree": shape.to_paths_literal() if shape else "none"}
                if name in self.predictions:
                    written["prediction"] = self.predictions[name].to_dict()
            if drafter != DrafterConfig():  # the draft model: no entry, as before drafters
                written["drafter"] = drafter.table
            if backend != "specscope":
                written["backend"] = backend
            return written

        return {
            "format": POLICY_FORMAT,
            "domains": {
                d: entry(d, s, self.drafter_for(d), self.backend_for(d))
                for d, s in self.trees.items()
            },
            "uniform": entry(ALL_DOMAINS, self.uniform, self.uniform_drafter, self.uniform_backend),
            **self.info,
        }

    def save(self, path: str | Path, inside: Path | None = None) -> Path:
        """Write as strict JSON (no NaN literals); ``inside``: the run directory the file lies in,
        whose links are refused (see :func:`specscope.files.write_output`)."""
        return write_json(path, self.to_dict(), inside)

    @classmethod
    def load(cls, path: str | Path) -> PolicyFile:
        path = Path(path)
        if path.suffix != ".toml":
            return cls.from_dict(
                read_json_object(path, PolicyError, "policy file"), where=str(path)
            )
        data = read_toml_table(path, PolicyError, "policy file")
        return cls.from_dict(data, where=str(path))

    @classmethod
    def from_dict(cls, data: dict, where: str = "policy") -> PolicyFile:
        parse(PolicyDocument, data, where, PolicyError)  # every type and key, then what they mean
        unknown = sorted(set(data["domains"]) - set(DOMAINS))
        if unknown:
            raise PolicyError(f"{where}: unknown domain(s) {unknown}; known: {', '.join(DOMAINS)}")
        trees, drafters, predictions, backends = {}, {}, {}, {}
        for domain, entry in data["domains"].items():
            label = f"{where}: domain {domain!r}"
            trees[domain] = parse_tree(entry, label)
            drafters[domain] = parse_drafter(entry, label)
            check_drafter(label, trees[domain], drafters[domain])
            backends[domain] = parse_backend(entry, label)
            check_backend(label, trees[domain], drafters[domain], backends[domain])
            if isinstance(entry, dict) and "prediction" in entry:
                predictions[domain] = Prediction.from_dict(entry["prediction"], label)
        uniform, uniform_drafter, uniform_backend = None, DrafterConfig(), "specscope"
        if "uniform" in data:
            uniform = parse_tree(data["uniform"], f"{where}: uniform")
            uniform_drafter = parse_drafter(data["uniform"], f"{where}: uniform")
            check_drafter(f"{where}: uniform", uniform, uniform_drafter)
            uniform_backend = parse_backend(data["uniform"], f"{where}: uniform")
            check_backend(f"{where}: uniform", uniform, uniform_drafter, uniform_backend)
            if isinstance(data["uniform"], dict) and "prediction" in data["uniform"]:
                predictions[ALL_DOMAINS] = Prediction.from_dict(
                    data["uniform"]["prediction"], f"{where}: uniform"
                )
        info = {k: v for k, v in data.items() if k not in ("format", "domains", "uniform")}
        return cls(
            trees=trees,
            uniform=uniform,
            info=info,
            drafters={d: v for d, v in drafters.items() if v != DrafterConfig()},
            uniform_drafter=uniform_drafter,
            predictions=predictions,
            backends={d: b for d, b in backends.items() if b != "specscope"},
            uniform_backend=uniform_backend,
        )


def parse_backend(entry, where: str) -> str:
    """``{"backend": "transformers"}``; absent: specscope's decoder."""
    backend = entry.get("backend", "specscope") if isinstance(entry, dict) else "specscope"
    if backend not in BACKENDS:
        raise PolicyError(
            f"{where}: unknown backend {backend!r}; allowed: "
            + "; ".join(f"{k} ({v})" for k, v in BACKENDS.items())
        )
    return backend


def check_backend(
    where: str, shape: TreeShape | None, drafter: DrafterConfig, backend: str
) -> None:
    """transformers' assisted generation runs a chain drafted by the draft model, nothing else."""
    if backend not in BACKENDS:
        raise PolicyError(f"{where}: unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "transformers" and (
        shape is None or not shape.is_chain or drafter != DrafterConfig()
    ):
        tree = shape.to_paths_literal() if shape else "none"
        raise PolicyError(
            f"{where}: backend transformers (assisted generation) decodes a chain drafted by the "
            f"draft model; got tree {tree} with drafter {drafter.label}"
        )


def check_drafter(where: str, shape: TreeShape | None, drafter: DrafterConfig) -> None:
    """A drafter other than the draft model needs a tree, and a chain-only drafter a chain."""
    if drafter == DrafterConfig():
        return
    if shape is None:
        raise PolicyError(
            f"{where}: drafter {drafter.label} with tree none; a domain that does not "
            "speculate has no drafter (drop 'drafter', or give a tree)"
        )
    if drafter.spec.chain_only and not shape.is_chain:
        raise PolicyError(
            f"{where}: the {drafter.kind} drafter proposes one chain, but tree "
            f"{shape.to_paths_literal()} has branches; give a chain such as "
            "[(0,), (0, 0), (0, 0, 0)]"
        )
    try:
        drafter.check_chain(shape.is_chain, len(shape))
    except DrafterError as e:
        raise PolicyError(f"{where}: {e}") from None


class PolicyEntry(BaseModel):
    """A policy file's entry of a domain, its uniform entry, or one of its candidates: the
    schema (what ``tune`` writes: :meth:`Choice.to_dict`). A hand-written entry needs only
    ``tree``; ``drafter`` absent is the draft model, ``backend`` absent specscope's decoder."""

    model_config = INPUT
    tree: str | list[list[int]]  # path tuples ("[(0,), (0, 0)]" or [[0], [0, 0]]) or "none"
    drafter: DrafterConfig | None = None
    backend: str = "specscope"  # BACKENDS
    prediction: PredictionRecord | None = None
    nodes: int | None = None
    expected_tau: float | None = None
    predicted_speedup: float | None = None
    step_time_s: float | None = None
    domain: str | None = None  # a candidate's


class PolicyDocument(BaseModel):
    """A policy file (``specscope tune``'s JSON, or a hand-written TOML): an entry per domain (a
    table, or a tree literal) and the uniform entry; what else the tune records (its costs,
    acceptance, source, an engine's own section) is read by name where it is used."""

    model_config = ConfigDict(extra="allow")
    format: str | None = None
    domains: dict[str, PolicyEntry | str]
    uniform: PolicyEntry | str | None = None
    candidates: list[PolicyEntry] = []


def parse_drafter(entry, where: str) -> DrafterConfig:
    """``{"drafter": {"kind": "ngram", "prompt_lookup_min": 2, ...}}`` of an entry its schema
    checked (:class:`PolicyEntry`); absent: the draft model."""
    if not isinstance(entry, dict) or entry.get("drafter") is None:
        return DrafterConfig()
    return parse(DrafterConfig, entry["drafter"], where, PolicyError, "drafter")


def parse_tree(entry, where: str) -> TreeShape | None:
    """``{"tree": [[0], [0, 0]]}``, ``{"tree": "[(0,), (0, 0)]"}`` or ``{"tree": "none"}``."""
    tree = entry.get("tree") if isinstance(entry, dict) else entry
    if tree is None:
        raise PolicyError(f"{where}: missing 'tree' (path tuples, or \"none\")")
    try:
        if isinstance(tree, str):
            return None if tree.strip().lower() == "none" else TreeShape.parse(tree)
        if isinstance(tree, list) and all(isinstance(p, list) for p in tree):
            return TreeShape.from_paths([tuple(p) for p in tree])
    except TreeConfigError as e:
        raise PolicyError(f"{where}: malformed tree: {e}") from None
    raise PolicyError(
        f'{where}: malformed tree {tree!r}: give path tuples such as [[0], [1], [0, 0]] or "none"'
    )
