"""llama.cpp's pass costs as llama-bench times them, and what they say about chains of K: which
settings can pay at all.

:class:`PassCosts` holds llama.cpp's pass costs (target passes of 1..K+1 tokens, draft passes,
a sample) and turns them into a predicted speed-up for given tokens per step, and into the
break-even points: the tokens per step a chain of K needs to pay, and the draft cost at which even
perfect acceptance stops paying. Those costs come from llama-bench (:class:`CostCurve`,
:func:`measure_cost_grid`), timed per setting and quantisation, each model alone.

The step model ``specscope llamacpp`` prices draft-model settings with
(:class:`ServerStepModel`) prices each step at the passes llama-server runs for it
(:meth:`PassCosts.passes_s`, read in the llama.cpp source specscope builds), at llama-bench's
costs of each model alone, scaled by what plain and one draft-model setting measured in
llama-server once (:func:`calibrate`), on the tuning prompts: never on the cells it then
predicts. This module does not run models
(:mod:`.programs` and :mod:`.server` do); reading a GGUF's quantisation needs the ``llamacpp``
extra.
"""

from __future__ import annotations

import datetime
import io
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel

from ...cache import cache_dir, recorded_path
from ...errors import SpecscopeError, require
from ...files import read_json_object, write_output
from ...schemas import INPUT, parse
from ...tune.costs import interpolate
from .programs import BenchGrid, quantize, run_llama_bench
from .server import ServerSetting

# --- costs and predictions ------------------------------------------------------------------------


@dataclass(frozen=True)
class PassCosts:
    """llama.cpp's measured pass costs on this machine, in seconds, and the passes of a
    draft-model step as llama-server runs them (:meth:`passes_s`)."""

    target_s: tuple[tuple[int, float], ...]  # (tokens in one target eval, seconds)
    draft_s: tuple[tuple[int, float], ...]  # (tokens in one draft eval, seconds)
    sample_s: float  # one greedy sample of the target
    context_len: int
    threads: int

    def target(self, tokens: float) -> float:
        return interpolate(self.target_s, tokens)

    def draft(self, tokens: float) -> float:
        return interpolate(self.draft_s, tokens)

    @property
    def plain_token_s(self) -> float:
        return self.target(1) + self.sample_s

    def passes_s(self, drafted: float, stopped: float = 0.0) -> float:
        """The model passes of one llama-server step that drafted ``drafted`` tokens with
        ``draft-simple``, as the llama.cpp that specscope builds runs it (commit 0c1e570:
        ``common/speculative.cpp``, ``tools/server/server-context.cpp``), sampling left out:

        - the draft evaluates the last sampled token, then each drafted token but the last, one
          at a time; where ``p_min`` stopped the chain before K (``stopped`` 1), the last one
          too, since the stop is seen when the next token is sampled;
        - the target evaluates the last sampled token and the drafted ones in one pass;
        - the draft evaluates that same batch again (the server's ``process`` step, which
          re-evaluates the drafted tokens "for simplicity": ``TAG_SPEC_AVOID_DRAFT_REEVAL``).

        A step that drafts nothing because ``p_min`` stopped at the first token is
        ``passes_s(0, 1)``; one where the server does not draft at all is ``passes_s(0)``.
        """
        d = drafted
        return (d + stopped) * self.draft(1) + self.draft(d + 1) + self.target(d + 1)

    def break_even_tau(self, k: int) -> float:
        """Tokens per step at which a chain of K is as fast as plain decoding (at most K + 1
        are possible, above that no acceptance pays)."""
        return self.passes_s(k) / self.target(1)

    def break_even_draft_s(self, k: int) -> float:
        """The draft's one-token cost below which K pays at perfect acceptance (K + 1 tokens per
        step), its batch of K + 1 tokens scaled with it."""
        # a step's draft work counted in one-token passes: K of them and the batch of K + 1
        draft_tokens = k + self.draft(k + 1) / self.draft(1)
        return max(0.0, ((k + 1) * self.target(1) - self.target(k + 1)) / draft_tokens)

    def to_dict(self) -> dict:
        return {
            "engine": "llama.cpp",
            "target_s": [list(x) for x in self.target_s],
            "draft_s": [list(x) for x in self.draft_s],
            "sample_s": self.sample_s,
            "plain_token_s": self.plain_token_s,
            "context_len": self.context_len,
            "threads": self.threads,
        }


# --- llama-server's step, priced -------------------------------------------------------------------


@dataclass(frozen=True)
class ServerStepModel:
    """llama-server's decoding step with the draft model, priced: the passes llama.cpp runs per
    step (:meth:`PassCosts.passes_s`) at llama-bench's costs of each model alone, scaled by two
    factors llama-server measured once, on the calibration requests (plain and one draft-model
    setting on the tuning prompts), and never on the cells it then predicts (those are other
    settings, or held-out prompts):

    - ``plain_scale``: plain decoding's time per token in llama-server over the curves' one-token
      pass and sample (the server's own work per token);
    - ``shared_scale``: a draft-model step's time in llama-server over what the curves price it
      at (the two models share the cores and the server's loop; the draft's sampling).

    A setting's step is priced from how many tokens its steps draft (``mix``: the share of
    steps drafting 0, 1, 2, ... tokens, from the replay), each step at its own passes."""

    costs: PassCosts
    plain_scale: float
    shared_scale: float
    calibration: dict = field(default_factory=dict)  # what the two factors were measured on

    @property
    def plain_token_s(self) -> float:
        return self.plain_scale * self.costs.plain_token_s

    def curve_step_s(self, mix: Sequence[float], k: int, stop_rule: bool, tau: float) -> float:
        """The curves' price of a mean step (unscaled) of a chain of at most ``k`` tokens: a
        share ``mix[d]`` of steps drafts d tokens (those below ``k`` were stopped by the
        ``stop_rule``, ``p_min``, where there is one); ``tau`` tokens emitted per step."""
        passes = sum(
            share * self.costs.passes_s(d, float(stop_rule and d < k))
            for d, share in enumerate(mix)
            if share > 0
        )
        return passes + tau * self.costs.sample_s

    def step_s(self, mix: Sequence[float], k: int, stop_rule: bool, tau: float) -> float:
        return self.shared_scale * self.curve_step_s(mix, k, stop_rule, tau)

    def predicted_speedup(self, mix: Sequence[float], k: int, stop_rule: bool, tau: float) -> float:
        """Decode tokens per second over plain decoding's in llama-server."""
        return tau * self.plain_token_s / self.step_s(mix, k, stop_rule, tau)

    def to_dict(self) -> dict:
        return {
            "costs": self.costs.to_dict(),
            "plain_scale": round(self.plain_scale, 4),
            "shared_scale": round(self.shared_scale, 4),
            "plain_token_s": round(self.plain_token_s, 6),
            "calibration": self.calibration,
        }


@dataclass(frozen=True)
class ServerTimings:
    """Requests llama-server timed, summed: what a calibration reads of them."""

    tokens: int  # after the first (the prefill's) token
    steps: int  # decoding steps after the first
    drafted: int  # tokens the draft proposed
    decode_s: float

    @classmethod
    def of(cls, requests) -> ServerTimings:
        """From :class:`~specscope.tune.backends.Request` rows: a request's later steps are its
        tokens after the first less its accepted drafts."""
        return cls(
            sum(r.tokens - 1 for r in requests),
            sum(r.tokens - 1 - (r.accepted or 0) for r in requests),
            sum(r.drafted or 0 for r in requests),
            sum(r.decode_s for r in requests),
        )


def calibrate(
    costs: PassCosts, plain: ServerTimings, spec: ServerTimings, about: dict
) -> ServerStepModel:
    """The two factors from plain's requests and one draft-model setting's (one without
    ``p_min``: every step drafts until K, or until the request's token budget, so its mean
    step drafts the server's own ``drafted`` over ``steps``) on the same prompts."""
    if plain.tokens < 1 or spec.steps < 1:
        raise SpecscopeError(
            "a llama-server calibration needs plain's and the draft-model setting's requests "
            f"to decode past their first token (got {plain.tokens} and {spec.steps} steps)"
        )
    curve_step = (
        costs.passes_s(spec.drafted / spec.steps) + spec.tokens / spec.steps * costs.sample_s
    )
    return ServerStepModel(
        costs,
        plain.decode_s / plain.tokens / costs.plain_token_s,
        spec.decode_s / spec.steps / curve_step,
        {**about, "plain": asdict(plain), "draft_model": asdict(spec)},
    )


def pass_costs_for(
    grid: CostGrid, setting: ServerSetting, target_quant: str, draft_quant: str
) -> PassCosts:
    """The pass costs of ``setting``'s threads, polling and batch sizes, for a target and a draft
    of these quantisations, from the grid's curves; refused, naming what the grid holds, where
    it has no such pair."""
    want = (
        setting.threads,
        setting.poll,
        setting.batch,
        setting.ubatch,
        setting.draft_threads or setting.threads,
        setting.poll if setting.draft_poll is None else setting.draft_poll,
    )
    found = []
    for c in grid.candidates():
        if c.draft is None:
            continue
        t, d = c.target, c.draft
        have = (t.threads, t.poll, t.batch, t.ubatch, d.threads, d.poll)
        if have == want and (t.quant, d.quant) == (target_quant, draft_quant):
            return c.costs()
        found.append(f"{t.quant}+{d.quant} t{t.threads}/{d.threads} poll{t.poll}/{d.poll} "
                     f"b{t.batch}/{t.ubatch}")  # fmt: skip
    raise SpecscopeError(
        f"the cost grid has no curves for a {target_quant} target and a {draft_quant} draft at "
        f"threads {want[0]}/{want[4]}, poll {want[1]}/{want[5]}, batch {want[2]}/{want[3]}; it "
        f"holds: {'; '.join(sorted(set(found))) or 'no target-draft pair'}"
    )


# --- pass costs in llama.cpp's own loop (llama-bench), per setting -----------------------------------


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one pass of n tokens after ``depth`` tokens of context, as llama-bench timed
    one model alone under one setting (threads, polling, batch and micro-batch sizes)."""

    __pydantic_config__ = INPUT  # a cost grid's curve (specscope.schemas)

    role: str  # target or draft
    quant: str  # the GGUF's quantisation label (Q4_K_M, Q8_0, ...)
    model: str  # the GGUF's file name
    threads: int
    poll: int
    batch: int
    ubatch: int
    depth: int
    seconds: tuple[tuple[int, float], ...]  # (tokens in the pass, mean seconds)
    stddev: tuple[tuple[int, float], ...]

    def at(self, tokens: float) -> float:
        return interpolate(self.seconds, tokens)

    def relative(self, tokens: int) -> float:
        """A pass of ``tokens`` in units of a one-token pass."""
        return self.at(tokens) / self.at(1)

    @property
    def key(self) -> tuple:
        return (self.role, self.quant, self.threads, self.poll, self.batch, self.ubatch, self.depth)

    def to_dict(self) -> dict:
        return {
            **{
                k: getattr(self, k)
                for k in ("role", "quant", "model", "threads", "poll", "batch", "ubatch", "depth")
            },
            "seconds": [list(x) for x in self.seconds],
            "stddev": [list(x) for x in self.stddev],
        }


def curves_from_bench(rows, role: str, quant: str) -> list[CostCurve]:
    """llama-bench's prompt tests (:func:`specscope.serving.llamacpp.programs.parse_llama_bench`) grouped into
    one curve per model and setting."""
    groups: dict[tuple, list] = {}
    for r in rows:
        if r.n_prompt and not r.n_gen:
            groups.setdefault(
                (r.model, r.n_threads, r.poll, r.n_batch, r.n_ubatch, r.n_depth), []
            ).append(r)
    out = []
    for (model, threads, poll, batch, ubatch, depth), part in groups.items():
        part = sorted(part, key=lambda r: r.n_prompt)
        out.append(
            CostCurve(
                role,
                quant,
                model,
                threads,
                poll,
                batch,
                ubatch,
                depth,
                tuple((r.n_prompt, r.seconds) for r in part),
                tuple((r.n_prompt, r.stddev_ns / 1e9) for r in part),
            )
        )
    return out


@dataclass(frozen=True)
class Candidate:
    """One way to run the pair in llama-server, with its pass costs: the models' quantisations
    and a :class:`~specscope.serving.llamacpp.server.ServerSetting` (K aside). Plain decoding uses
    only the target's curve (``draft`` is None)."""

    setting: ServerSetting  # with k = 0
    target: CostCurve
    draft: CostCurve | None

    @property
    def name(self) -> str:
        base = self.setting.name.replace("plain-", "")
        if self.draft is None:
            return f"plain {self.target.quant} {base}"
        return f"{self.target.quant}+{self.draft.quant} {base} td{self.draft.threads}"

    def costs(self) -> PassCosts:
        """:class:`PassCosts` from the curves (llama-bench times no sampling: ``sample_s`` 0; a
        greedy sample is about 0.1 ms here, under 1% of a pass)."""
        draft = self.draft.seconds if self.draft else ((1, 0.0), (2, 0.0))
        return PassCosts(self.target.seconds, draft, 0.0, self.target.depth, self.target.threads)


def candidates(curves: list[CostCurve]) -> list[Candidate]:
    """Every plain setting (one per target curve) and every speculative one: a target curve with
    a draft curve at the same context depth, polling and batch sizes, with any draft threads."""
    targets = [c for c in curves if c.role == "target"]
    drafts = [c for c in curves if c.role == "draft"]
    out = []
    for t in targets:
        base = ServerSetting(threads=t.threads, poll=t.poll, batch=t.batch, ubatch=t.ubatch)
        out.append(Candidate(base, t, None))
        for d in drafts:
            if (d.depth, d.poll, d.batch, d.ubatch) == (t.depth, t.poll, t.batch, t.ubatch):
                out.append(
                    Candidate(
                        ServerSetting(
                            threads=t.threads,
                            poll=t.poll,
                            batch=t.batch,
                            ubatch=t.ubatch,
                            draft_threads=d.threads,
                            draft_poll=d.poll,
                        ),
                        t,
                        d,
                    )
                )
    return out


def break_even_rows(options: list[Candidate], ks) -> list[dict]:
    """Per speculative candidate and K: the pass costs relative to one target token, the tokens
    per step needed to pay (at most K + 1 are possible) and the largest draft cost that pays at
    perfect acceptance."""
    rows = []
    for cand in options:
        if cand.draft is None:
            continue
        c = cand.costs()
        for k in ks:
            rows.append(
                {
                    "setting": cand.name,
                    "k": k,
                    "target_1_ms": 1000 * c.target(1),
                    "target_k1_ms": 1000 * c.target(k + 1),
                    "target_k1_rel": c.target(k + 1) / c.target(1),
                    "draft_1_ms": 1000 * c.draft(1),
                    "break_even_tau": c.break_even_tau(k),
                    "max_tau": k + 1,
                    "pays_at_all": c.break_even_tau(k) < k + 1,
                    "break_even_draft_ms": 1000 * c.break_even_draft_s(k),
                }
            )
    return rows


class CostGridFile(BaseModel):
    """A llama.cpp cost grid as ``specscope llamacpp`` writes it: its schema."""

    model_config = INPUT
    format: Literal["specscope-llama-costs/1"]
    info: dict[str, Any] = {}  # llama.cpp build, CPU, date, the llama-bench grids
    curves: list[CostCurve]


@dataclass(frozen=True)
class CostGrid:
    """Pass-cost curves of the target and draft under every measured setting, with provenance."""

    curves: tuple[CostCurve, ...]
    info: dict = field(default_factory=dict)  # llama.cpp build, CPU, date, the llama-bench grids

    def to_dict(self) -> dict:
        return {
            "format": "specscope-llama-costs/1",
            "info": self.info,
            "curves": [c.to_dict() for c in self.curves],
        }

    @classmethod
    def from_dict(cls, d: dict, where: str = "cost grid") -> CostGrid:
        """A cost grid from its JSON form, checked by its schema (:class:`CostGridFile`)."""
        read = parse(CostGridFile, d, where, SpecscopeError)
        return cls(tuple(read.curves), read.info)

    @classmethod
    def load(cls, path: str | Path) -> CostGrid:
        return cls.from_dict(read_json_object(path, SpecscopeError, "cost grid"), str(path))

    def candidates(self) -> list[Candidate]:
        return candidates(list(self.curves))

    def curve_table(self):
        """One row per curve: each pass size's cost in ms and relative to a one-token pass."""
        rows = []
        for c in self.curves:
            row = {
                "role": c.role,
                "quant": c.quant,
                "threads": c.threads,
                "poll": c.poll,
                "batch": c.batch,
                "ubatch": c.ubatch,
                "depth": c.depth,
                "1 tok ms": 1000 * c.at(1),
            }
            row.update({f"x{n}": c.relative(n) for n, _ in c.seconds if n > 1})
            rows.append(row)
        return pd.DataFrame(rows)


@dataclass(frozen=True)
class GridOptions:
    """The cost grid ``specscope llamacpp`` measures when no ``--costs`` file is given."""

    threads: tuple[int, ...] = (2,)
    polls: tuple[int, ...] = (0, 50)
    draft_threads: tuple[int, ...] = (2,)
    batches: tuple[tuple[int, int], ...] = ((2048, 512),)
    quants: tuple[str, ...] = ()  # the target's, made with llama-quantize; () the GGUF as given
    tokens: int = 8  # passes of 1..tokens
    depth: int = 192
    repetitions: int = 5


def measure_grid(tools, target: Path, draft: Path, opts: GridOptions, echo) -> CostGrid:
    """llama-bench over ``opts``: the target as given and requantised to each of
    ``opts.quants``, the draft as given."""
    targets = quantised_variants(tools, target, opts.quants or (gguf_quant(target),), echo)
    curves, info = [], {}
    for batch, ubatch in opts.batches:  # one llama-bench call per pair: it would cross b and ub

        def bench(threads, batch=batch, ubatch=ubatch):
            return BenchGrid(
                threads,
                opts.polls,
                (batch,),
                (ubatch,),
                tuple(range(1, opts.tokens + 1)),
                (opts.depth,),
                opts.repetitions,
            )

        part = measure_cost_grid(
            tools,
            targets,
            {gguf_quant(draft): draft},
            bench(opts.threads),
            bench(opts.draft_threads),
            echo,
        )
        curves += part.curves
        info = info or part.info
    info["grid"] = {
        "threads": list(opts.threads),
        "polls": list(opts.polls),
        "draft_threads": list(opts.draft_threads),
        "batches": [list(b) for b in opts.batches],
        "quants": list(opts.quants),
        "tokens": opts.tokens,
        "depth": opts.depth,
        "repetitions": opts.repetitions,
    }
    return CostGrid(tuple(curves), info)


def gguf_quant(path: Path) -> str:
    """A GGUF's quantisation as llama.cpp names it (``Q4_K_M``, ``Q8_0``, ``F16``), from its
    ``general.file_type``; ``given`` when the file does not say."""
    require("llamacpp", "reading a GGUF's quantisation")
    import gguf  # the llamacpp extra

    try:
        field = gguf.GGUFReader(str(path)).fields.get("general.file_type")
        kind = gguf.LlamaFileType(int(field.parts[field.data[0]][0]))
    except (KeyError, ValueError, AttributeError, TypeError, IndexError):
        return "given"
    return kind.name.removeprefix("MOSTLY_") if kind.name != "ALL_F32" else "F32"


def quantised_variants(tools, source: Path, quants, echo=print) -> dict[str, Path]:
    """``source`` requantised to each of ``quants`` with llama-quantize, cached beside the other
    builds (requantising a Q4_K_M: the weights keep its rounding, the costs are the new format's).
    The source's own quantisation maps to the source itself."""
    own = gguf_quant(source)
    out = {}
    for q in quants:
        if q in (own, "given"):
            out[q] = source
            continue
        path = cache_dir() / "llama.cpp" / "quant" / f"{source.stem}-{q}.gguf"
        if not path.is_file():
            echo(f"llama-quantize {source.name} -> {q} ...")
        out[q] = quantize(tools, source, path, q, allow_requantize=own != "F16")
    return out


def measure_cost_grid(
    tools, targets: dict[str, Path], drafts: dict[str, Path], target_grid, draft_grid, echo=print
) -> CostGrid:
    """llama-bench over ``target_grid`` for each target GGUF and ``draft_grid`` for each draft
    GGUF (keyed by quantisation label): the curves every candidate setting is priced with."""
    curves: list[CostCurve] = []
    for role, models, grid in (("target", targets, target_grid), ("draft", drafts, draft_grid)):
        for quant, path in models.items():
            echo(f"llama-bench {role} {quant}: {grid.tests} tests x {grid.repetitions} ...")
            curves += curves_from_bench(run_llama_bench(tools, path, grid), role, quant)
    info = {
        "llama_cpp_python": tools.version,
        "bin_dir": recorded_path(tools.bin_dir),
        "cpu": platform.processor() or platform.machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "target_grid": asdict_grid(target_grid),
        "draft_grid": asdict_grid(draft_grid),
        "models": {f"target {q}": recorded_path(p) for q, p in targets.items()}
        | {f"draft {q}": recorded_path(p) for q, p in drafts.items()},
    }
    return CostGrid(tuple(curves), info)


def asdict_grid(grid) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(grid).items()}


def plot_cost_curves(grid: CostGrid, path: Path, inside: Path | None = None) -> Path | None:
    """Pass cost relative to a one-token pass against tokens in the pass, one line per curve
    (target solid, draft dashed), with the ideal flat line 1 and the linear line n. None when
    matplotlib is missing."""
    try:
        from matplotlib.figure import Figure  # the plot extra
    except ImportError:
        return None
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    top = max((n for c in grid.curves for n, _ in c.seconds), default=1)
    ax.plot([1, top], [1, top], color="grey", lw=0.8, ls=":", label="n one-token passes")
    for c in grid.curves:
        ns = [n for n, _ in c.seconds]
        ax.plot(
            ns,
            [c.relative(n) for n in ns],
            ls="-" if c.role == "target" else "--",
            marker="o",
            ms=3,
            label=f"{c.role} {c.quant} t{c.threads} poll{c.poll} "
            f"b{c.batch}/{c.ubatch} ({1000 * c.at(1):.0f} ms)",
        )
    ax.set_xlabel("tokens in one pass")
    ax.set_ylabel("cost / cost of a one-token pass")
    ax.set_title(
        "llama.cpp pass costs (llama-bench, context depth "
        f"{', '.join(sorted({str(c.depth) for c in grid.curves}))})"
    )
    ax.legend(fontsize=6, loc="upper left")
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120, bbox_inches="tight")
    return write_output(path, image.getvalue(), inside)
