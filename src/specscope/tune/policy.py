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
no ``backend`` means specscope's decoder. ``"stop": {"signal": "p_draft", "threshold": 0.3}``
(:class:`.predict.Stop`) cuts the entry's tree node by node in specscope's decoder; ``tune``
weighs every stop rule of :data:`.predict.STOP_GRID` on every tree beside it uncut, and writes
null where none pays.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
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
from .predict import EXTRAPOLATED, Prediction, PredictionRecord, Predictor, Stop
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
class Choice:
    """The tree chosen for one domain, the drafter that proposes it, the stop rule that cuts it
    node by node, and its predicted figures."""

    shape: TreeShape | None
    predicted_speedup: float
    step_time_s: float
    drafter: DrafterConfig = DrafterConfig()  # what proposes the tree
    prediction: Prediction | None = None  # its tokens per step, and how predicted (None: no tree)
    backend: str = "specscope"  # what decodes it (BACKENDS)
    stop: Stop | None = None  # specscope's decoder only

    @property
    def tokens_per_step(self) -> float:
        return self.prediction.tokens_per_step if self.prediction else 1.0

    def to_dict(self) -> dict:
        return {
            "tree": self.shape.to_paths_literal() if self.shape else "none",
            "nodes": len(self.shape) if self.shape else 0,
            "stop": dataclasses.asdict(self.stop) if self.stop else None,
            "predicted_speedup": round(self.predicted_speedup, 4),
            "step_time_s": round(self.step_time_s, 6),
            **({"prediction": self.prediction.to_dict()} if self.prediction else {}),
            **({"backend": self.backend} if self.backend != "specscope" else {}),
        }


def priced(
    costs: CostModel,
    shape: TreeShape,
    prediction: Prediction,
    drafter: DrafterConfig = DrafterConfig(),
    backend: str = "specscope",
    stop: Stop | None = None,
) -> Choice:
    """``shape`` (cut by ``stop``) decoded by ``backend`` as predicted: its step time on
    ``costs`` and its speed-up over plain decoding, from the tokens per step after the first."""
    rate, share = prediction.speed_terms()
    if backend == "transformers":
        step = costs.assisted_step_time(len(shape))
    elif stop is not None:
        step = costs.stopped_step_time(shape, prediction.verified, prediction.fed)
    else:
        step = costs.step_time(shape, share)
    return Choice(
        shape, rate / step * costs.plain_token_s, step, drafter, prediction, backend, stop
    )


def _best(choices, none: Choice, min_speedup: float) -> Choice:
    """The fastest of ``choices`` (the first of equals) if it beats plain decoding and
    ``min_speedup``, else ``none``."""
    best = max(choices, key=lambda c: c.predicted_speedup, default=none)
    return best if best.predicted_speedup > max(1.0, min_speedup) else none


def best_tree(
    acc: AcceptanceVector,
    costs: CostModel,
    config: TuneConfig = TuneConfig(),
    drafter: DrafterConfig = DrafterConfig(),
    proposal_rate: float = 1.0,
    predict: Callable[..., Prediction] | None = None,
    stops: Callable[[TreeShape], Sequence[Stop]] | None = None,
) -> Choice:
    """Over every node budget and depth limit of ``config``, the optimal tree (under ``acc``) of
    best predicted speed-up (for a chain-only drafter, the best chain), each uncut and cut by
    each of ``stops(tree)``; no speculation (``shape=None``) unless one beats
    ``config.min_speedup``. ``predict(tree, stop=...)``: its predicted tokens per step and
    proposal rate (:meth:`.predict.Predictor.predict`); without it, ``acc``'s expected tau and
    ``proposal_rate`` (the fraction of steps in which the drafter proposes)."""
    if predict is None:
        predict = lambda shape, stop=None: Prediction(  # noqa: E731
            acc.expected_tau(shape), method=EXTRAPOLATED, proposal_rate=proposal_rate
        )
    depth_limit = min(config.max_depth, acc.max_depth)
    chains = drafter.spec.chain_only
    shapes = _candidates(acc, config.max_nodes, depth_limit, config.max_rank, chains)
    return _best(
        (
            priced(costs, shape, predict(shape, stop=stop), drafter, stop=stop)
            for shape in shapes
            if _fits(drafter, shape)
            for stop in (None, *(stops(shape) if stops else ()))
        ),
        Choice(None, 1.0, costs.plain_token_s),
        config.min_speedup,
    )


def _fits(drafter: DrafterConfig, shape: TreeShape) -> bool:
    """Whether ``drafter`` drafts with ``shape`` (llama.cpp's ngram-simple never drafts with a
    chain shorter than its n-gram)."""
    try:
        drafter.check_chain(shape.is_chain, len(shape))
    except DrafterError:
        return False
    return True


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
    costs: CostModel, config: TuneConfig, predictor: Predictor, domain: str
) -> Choice:
    """The chain of best predicted speed-up in transformers' assisted generation (a draft
    model's, priced by ``costs.assisted_step_s``), among those ``predictor``'s records hold; no
    speculation unless one beats ``config.min_speedup``."""
    chains = (TreeShape.chain(k) for k in range(1, config.max_depth + 1))
    return _best(
        (
            priced(costs, shape, predictor.predict(shape, domain), backend="transformers")
            for shape in itertools.takewhile(predictor.records.holds, chains)
        ),
        Choice(None, 1.0, costs.plain_token_s, backend="transformers"),
        config.min_speedup,
    )


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
    chains = (TreeShape.chain(k) for k in range(1, config.max_depth + 1))
    for shape in itertools.takewhile(predictor.records.holds, chains):
        if not _fits(m.drafter, shape):
            continue
        for domain in vectors:
            mine = predictor.with_interval(shape, domain)
            both = [priced(m.costs, shape, mine, m.drafter)]
            if assisted is not None:
                theirs = assisted.with_interval(shape, domain)
                both.append(priced(m.costs, shape, theirs, backend="transformers"))
            out += [{"domain": domain, "drafter": m.drafter.table, **c.to_dict()} for c in both]
    return out


KINDS = {  # the kinds of policy tune weighs: (a tree per domain, stop rules)
    "one tree": (False, False),
    "tree per domain": (True, False),
    "one tree + stop": (False, True),
    "tree per domain + stop": (True, True),
}


def policy_kinds(
    best: Mapping[tuple[str, bool], Choice],
    predictors: Mapping[tuple[str, str], tuple[Predictor, CostModel]],
    records: ReplayRecords,
) -> dict[str, dict[str, float]]:
    """Per kind of policy (:data:`KINDS`: one tree for all traffic, the paper's tree per domain,
    either cut by a per-node stop rule), the predicted speed-up per domain of ``records`` and for
    mixed traffic (their tokens after the first over their time, each domain decoded with its
    entry). ``best[domain, stops]``: the best entry (``ALL_DOMAINS``: for all traffic) with or
    without stop rules; ``predictors``: by drafter label and backend, what predicted it and its
    cost model."""

    def entry(domain: str, per_domain: bool, stops: bool) -> Choice:
        c = best[domain if per_domain else ALL_DOMAINS, stops]
        if per_domain or c.shape is None:
            return c
        predictor, costs = predictors[c.drafter.label, c.backend]  # the one tree in the domain
        prediction = predictor.predict(c.shape, domain, c.stop)
        return priced(costs, c.shape, prediction, c.drafter, c.backend, c.stop)

    tokens = np.bincount(records.prompt_domain, weights=records.lengths - 1)
    weights = {d: float(w) for d, w in zip(records.domains, tokens) if (d, True) in best}
    out = {}
    for kind, how in KINDS.items():
        speedups = {d: entry(d, *how).predicted_speedup for d in weights}
        time = sum(w / speedups[d] for d, w in weights.items())
        speedups["mixed"] = sum(weights.values()) / time
        out[kind] = {d: round(float(x), 4) for d, x in speedups.items()}
    return out


def tune(
    measured: Sequence[Measured],
    config: TuneConfig = TuneConfig(),
    source: dict | None = None,
) -> PolicyFile:
    """Per domain (and pooled: the uniform entry), the drafter, tree, stop rule and backend of
    best predicted speed-up over every measured drafter (the first listed wins a tie) in
    specscope's decoder and, for a draft model whose cost model timed it, in transformers'
    assisted generation; each chosen tree's prediction carries its interval (replayed) or says
    it is extrapolated. The kinds of policy it chose among are weighed side by side in the
    file's ``kinds`` (:func:`policy_kinds`)."""
    if not measured:
        raise PolicyError("tune needs at least one measurement run")
    labels = [m.drafter.label for m in measured]
    if len(set(labels)) < len(labels):
        raise PolicyError(f"tune got two runs of one drafter: {', '.join(labels)}")
    best: dict[tuple[str, bool], Choice] = {}  # (domain, with stop rules) -> the best entry
    vector: dict[str, AcceptanceVector] = {}  # the chosen drafter's (the first's if none pays)
    predictors: dict[tuple[str, str], tuple[Predictor, CostModel]] = {}
    candidates: list[dict] = []
    for m in measured:
        vectors = m.vectors(config)
        predictor = m.predictor(vectors)
        assisted = m.assisted_predictor(vectors)
        predictors[m.drafter.label, "specscope"] = predictor, m.costs
        if assisted is not None:
            predictors[m.drafter.label, "transformers"] = assisted, m.costs
        candidates += chain_candidates(m, predictor, config, vectors, assisted)
        for (name, acc), stops in itertools.product(vectors.items(), (False, True)):
            predict = functools.partial(predictor.predict, domain=name)
            cuts = predictor.stops if stops else None
            options = [best_tree(acc, m.costs, config, m.drafter, predict=predict, stops=cuts)]
            if assisted is not None:
                options.append(best_assisted(m.costs, config, assisted, name))
            for choice in options:  # the first listed wins a tie
                if (name, stops) not in best or (
                    choice.predicted_speedup > best[name, stops].predicted_speedup
                ):
                    best[name, stops] = choice
                    vector[name] = acc if stops else vector.get(name, acc)
    first = predictors[measured[0].drafter.label, "specscope"]  # a plain entry's

    def of(c: Choice) -> tuple[Predictor, CostModel]:
        return predictors.get((c.drafter.label, c.backend), first)

    choices = {  # the chosen entries, stop rules weighed, each with its prediction's interval
        name: dataclasses.replace(c, prediction=of(c)[0].with_interval(c.shape, name, c.stop))
        if c.shape
        else c
        for (name, stops), c in best.items()
        if stops
    }
    texts = {k: v for m in measured for k, v in m.texts.items()}
    # routed traffic is replayed entry by entry: not where an entry's tree is extrapolated
    # (deeper or wider than the records hold), which has no replay to route prompts through
    replayed = all(c.prediction is None or not c.prediction.extrapolated for c in choices.values())
    routed = replayed and routed_predictions(
        first[0].records,
        texts,
        {name: Destination(c.shape, *of(c), c.backend, c.stop) for name, c in choices.items()},
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
    info["kinds"] = policy_kinds(best, predictors, first[0].records)
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
        stops={d: c.stop for d, c in choices.items() if c.stop},
        uniform_stop=uniform.stop,
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
    stops: dict[str, Stop] = field(default_factory=dict)  # not listed: no stop rule
    uniform_stop: Stop | None = None

    def __post_init__(self) -> None:
        for domain, drafter in self.drafters.items():
            if domain not in self.trees:
                raise PolicyError(
                    f"domain {domain!r} has a drafter ({drafter.label}) but no tree; "
                    f"domains with trees: {', '.join(self.trees) or 'none'}"
                )
            check_drafter(f"domain {domain!r}", self.trees[domain], drafter)
        check_drafter("uniform", self.uniform, self.uniform_drafter)
        for domain in {*self.backends, *self.stops}:
            check_backend(
                f"domain {domain!r}",
                self.trees.get(domain),
                self.drafters.get(domain, DrafterConfig()),
                self.backends.get(domain, "specscope"),
                self.stops.get(domain),
            )
        check_backend(
            "uniform", self.uniform, self.uniform_drafter, self.uniform_backend, self.uniform_stop
        )

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

    def stop_for(self, domain: str) -> Stop | None:
        """The stop rule that cuts ``domain``'s tree (the uniform tree's for a domain not
        listed); None: the whole tree is drafted."""
        return self.stops.get(domain) if domain in self.trees else self.uniform_stop

    def to_dict(self) -> dict:
        def entry(name: str, shape: TreeShape | None) -> dict:
            if name in self.choices:
                written = self.choices[name].to_dict()
            else:
                written = {"tree": shape.to_paths_literal() if shape else "none"}
                if name in self.predictions:
                    written["prediction"] = self.predictions[name].to_dict()
            # ALL_DOMAINS, a domain no policy lists, gets the uniform entry's
            if (stop := self.stop_for(name)) is not None:
                written["stop"] = dataclasses.asdict(stop)
            if (drafter := self.drafter_for(name)) != DrafterConfig():  # the draft model: none
                written["drafter"] = drafter.table
            if (backend := self.backend_for(name)) != "specscope":
                written["backend"] = backend
            return written

        return {
            "format": POLICY_FORMAT,
            "domains": {d: entry(d, s) for d, s in self.trees.items()},
            "uniform": entry(ALL_DOMAINS, self.uniform),
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
        # every type and key, then what they mean
        document = parse(PolicyDocument, data, where, PolicyError)
        unknown = sorted(set(data["domains"]) - set(DOMAINS))
        if unknown:
            raise PolicyError(f"{where}: unknown domain(s) {unknown}; known: {', '.join(DOMAINS)}")

        def stop(entry) -> Stop | None:
            return entry.stop if isinstance(entry, PolicyEntry) else None

        trees, drafters, predictions, backends, stops = {}, {}, {}, {}, {}
        for domain, entry in data["domains"].items():
            label = f"{where}: domain {domain!r}"
            trees[domain] = parse_tree(entry, label)
            drafters[domain] = parse_drafter(entry, label)
            check_drafter(label, trees[domain], drafters[domain])
            backends[domain] = parse_backend(entry, label)
            stops[domain] = stop(document.domains[domain])
            check_backend(label, trees[domain], drafters[domain], backends[domain], stops[domain])
            if isinstance(entry, dict) and "prediction" in entry:
                predictions[domain] = Prediction.from_dict(entry["prediction"], label)
        uniform, uniform_drafter, uniform_backend = None, DrafterConfig(), "specscope"
        uniform_stop = stop(document.uniform)
        if "uniform" in data:
            label = f"{where}: uniform"
            uniform = parse_tree(data["uniform"], label)
            uniform_drafter = parse_drafter(data["uniform"], label)
            check_drafter(label, uniform, uniform_drafter)
            uniform_backend = parse_backend(data["uniform"], label)
            check_backend(label, uniform, uniform_drafter, uniform_backend, uniform_stop)
            if isinstance(data["uniform"], dict) and "prediction" in data["uniform"]:
                predictions[ALL_DOMAINS] = Prediction.from_dict(
                    data["uniform"]["prediction"], label
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
            stops={d: s for d, s in stops.items() if s is not None},
            uniform_stop=uniform_stop,
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
    where: str,
    shape: TreeShape | None,
    drafter: DrafterConfig,
    backend: str,
    stop: Stop | None = None,
) -> None:
    """transformers' assisted generation runs a chain drafted by the draft model, nothing else;
    a stop rule cuts a tree in specscope's decoder."""
    if backend not in BACKENDS:
        raise PolicyError(f"{where}: unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if stop is not None and (shape is None or backend != "specscope"):
        raise PolicyError(
            f"{where}: stop rule {stop.label} cuts a tree in specscope's decoder; got tree "
            f"{shape.to_paths_literal() if shape else 'none'} in backend {backend}"
        )
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
    ``tree``; ``drafter`` absent is the draft model, ``backend`` absent specscope's decoder,
    ``stop`` absent or null no stop rule."""

    model_config = INPUT
    tree: str | list[list[int]]  # path tuples ("[(0,), (0, 0)]" or [[0], [0, 0]]) or "none"
    drafter: DrafterConfig | None = None
    backend: str = "specscope"  # BACKENDS
    stop: Stop | None = None  # {"signal": "p_draft", "threshold": 0.3}
    prediction: PredictionRecord | None = None
    nodes: int | None = None
    expected_tau: float | None = None  # files written before: prediction.tokens_per_step
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
