"""Speculation in llama.cpp (llama-cpp-python): plain, fixed-K and routed per-domain decoding.

The GGUF pair runs natively on the CPU. llama-cpp-python's ``Llama.generate`` verifies the tokens
of a ``LlamaDraftModel``; :class:`GreedyDraft` is one backed by the draft GGUF: it keeps its own KV
cache across steps, drafts K greedy tokens per call, and counts how many of its previous proposal
the target accepted (the acceptance llama.cpp actually sees).

:func:`measure_pass_costs` times llama.cpp's own passes (target evals of 1..K+1 tokens over a
real context, draft evals of 1 and 2 tokens, a greedy sample), and :class:`PassCosts` turns them,
the expected tokens per step and the chance that all K drafts are accepted into a predicted
speed-up, and into the break-even points: the tokens per step a chain of K needs to pay, and the
draft cost at which even perfect acceptance stops paying. :class:`ChainAcceptance` gives those
expectations per domain from a measurement run's node records, with prompt resampling;
:mod:`specscope.serving` tunes K per domain and runs the side-by-side benchmark. This module does
not measure acceptance node by node (``specscope run`` does) and needs the ``llamacpp`` extra.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import SpecscopeError, require
from .tune.costs import interpolate

DEFAULT_KS = (1, 2, 3, 4)


class LlamaCppError(SpecscopeError, RuntimeError):
    """llama.cpp could not load a model or run a request; the message says why."""


def load_llama(path: str | Path, threads: int, n_ctx: int = 2048, logits_all: bool = False,
               draft_model=None):
    """A quiet ``llama_cpp.Llama`` on the CPU."""
    require("llamacpp", "running GGUF models in llama.cpp")
    from llama_cpp import Llama

    path = Path(path)
    if not path.is_file():
        raise LlamaCppError(f"GGUF file {path} does not exist")
    try:
        return Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads,
                     n_threads_batch=threads, n_gpu_layers=0, logits_all=logits_all,
                     draft_model=draft_model, verbose=False, seed=0)
    except ValueError as e:  # llama-cpp-python's "Failed to load model from file"
        raise LlamaCppError(f"llama.cpp cannot load {path}: {e}") from None


def _last_logits(llama) -> np.ndarray:
    return np.ctypeslib.as_array(llama._ctx.get_logits(), shape=(llama.n_vocab(),))


try:
    from llama_cpp.llama_speculative import LlamaDraftModel
except ImportError:  # the llamacpp extra is not installed: load_llama says which extra to install
    LlamaDraftModel = object


class GreedyDraft(LlamaDraftModel):
    """A ``LlamaDraftModel`` backed by a draft GGUF: K greedy tokens per call (K = 0: none).

    ``accepted`` lists, per verified step, how many of the previous call's K tokens the target
    kept (the first call of a request has no previous step); call :meth:`start` per request.
    """

    def __init__(self, llama, k: int):
        self.llama = llama
        self.k = k
        self.accepted: list[int] = []
        self._proposed_after: int | None = None  # context length of the last proposal

    def start(self, k: int) -> None:
        self.k = k
        self.accepted = []
        self._proposed_after = None

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        ids = [int(t) for t in input_ids]
        if self._proposed_after is not None:
            # the target kept `accepted` proposed tokens and appended its own next token
            self.accepted.append(len(ids) - self._proposed_after - 1)
        self._proposed_after = len(ids)
        if self.k <= 0:
            return np.array([], dtype=np.intc)
        llama = self.llama
        cached = llama.input_ids[:llama.n_tokens].tolist()
        common = 0
        for a, b in zip(cached, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # evaluate at least the newest token for its logits
        llama.n_tokens = common
        llama.eval(ids[common:])  # drops cache entries past `common` first
        out = []
        for i in range(self.k):
            token = int(np.argmax(_last_logits(llama)))  # ties: the lowest id, like the target
            out.append(token)
            if i + 1 < self.k:
                llama.eval([token])
        return np.array(out, dtype=np.intc)


@dataclass
class Generation:
    tokens: list[int]
    decode_s: float  # from the first generated token to the last: the decode phase only
    first_token_s: float  # prompt evaluation and the first token
    accepted: list[int] = field(default_factory=list)  # per verified step (speculation only)

    @property
    def steps(self) -> int:
        return len(self.accepted)


def generate(target, draft: GreedyDraft, prompt: list[int], k: int, max_new_tokens: int,
             eos: set[int]) -> Generation:
    """Greedy decoding of ``prompt`` by the target Llama, speculating K draft tokens per step
    (K = 0: plain decoding). The target's cache is cleared first, so every request starts cold."""
    draft.start(k)
    target.draft_model = draft if k > 0 else None
    target.reset()  # the prompt is evaluated from scratch: no prefix reuse across requests
    tokens: list[int] = []
    t0 = time.perf_counter()
    t_first = t_last = t0
    for token in target.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                 repeat_penalty=1.0, reset=True):
        t_last = time.perf_counter()
        if not tokens:
            t_first = t_last
        tokens.append(int(token))
        if int(token) in eos or len(tokens) >= max_new_tokens:
            break
    target.draft_model = None
    return Generation(tokens, t_last - t_first, t_first - t0, list(draft.accepted))


def eos_ids(llama) -> set[int]:
    """The end-of-generation tokens of a model's vocabulary (EOS, end of turn, ...)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llama._model.model)
    return {t for t in range(llama.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)}


# --- costs and predictions ------------------------------------------------------------------------


@dataclass(frozen=True)
class PassCosts:
    """llama.cpp's measured pass costs on this machine, in seconds.

    A verified step of a chain of K, as :class:`GreedyDraft` runs it: the draft evaluates the
    tokens its cache lacks (the target's token, and the last draft when all K were accepted: 1 or
    2 tokens in one eval), then K - 1 of its own proposals one at a time; the target evaluates
    K + 1 tokens in one pass and samples each token it emits (tau of them).
    """

    target_s: tuple[tuple[int, float], ...]  # (tokens in one target eval, seconds)
    draft_s: tuple[tuple[int, float], ...]  # (tokens in one draft eval, seconds), 1 and 2
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

    def step_s(self, k: int, tau: float, p_all: float) -> float:
        """One speculative step of K, given E[tokens per step] and P(all K drafts accepted)."""
        return (self.draft(1 + p_all) + (k - 1) * self.draft(1) + self.target(k + 1)
                + tau * self.sample_s)

    def predicted_speedup(self, k: int, tau: float, p_all: float) -> float:
        if k <= 0:
            return 1.0
        return tau * self.plain_token_s / self.step_s(k, tau, p_all)

    def break_even_tau(self, k: int) -> float:
        """Tokens per step at which a chain of K is as fast as plain decoding (taking one draft
        token per drafted position; at most K + 1 are possible, above that no acceptance pays)."""
        return (k * self.draft(1) + self.target(k + 1)) / self.target(1)

    def break_even_draft_s(self, k: int) -> float:
        """The draft cost per token below which K pays at perfect acceptance (K + 1 tokens per
        step, K + 1 draft tokens evaluated)."""
        return max(0.0, ((k + 1) * self.target(1) - self.target(k + 1)) / (k + 1))

    def to_dict(self) -> dict:
        return {"engine": "llama.cpp", "target_s": [list(x) for x in self.target_s],
                "draft_s": [list(x) for x in self.draft_s], "sample_s": self.sample_s,
                "plain_token_s": self.plain_token_s, "context_len": self.context_len,
                "threads": self.threads}


def measure_pass_costs(target, draft, prompt: list[int], max_k: int, repeats: int = 5,
                       threads: int = 0) -> PassCosts:
    """Median times of llama.cpp's passes after ``prompt`` (a real context): target evals of
    1..max_k + 1 tokens, draft evals of 1 and 2 tokens with the argmax, a greedy target sample.
    Each timed pass follows a one-token pass, as passes of different sizes alternate in a step
    (llama.cpp reuses a compute graph when a pass repeats the last one's shape)."""
    target.draft_model = None
    for llama in (target, draft):
        llama.reset()
        llama.eval(prompt)
    base = len(prompt)

    def timed(llama, tokens: list[int]) -> float:
        times = []
        for _ in range(repeats):
            llama.n_tokens = base
            llama.eval(tokens[:1])  # passes of other sizes come between, as in a real step
            llama.n_tokens = base
            t0 = time.perf_counter()
            llama.eval(tokens)
            if llama is draft:
                np.argmax(_last_logits(llama))
            times.append(time.perf_counter() - t0)
        llama.n_tokens = base
        return float(np.median(times))

    filler = prompt[-(max_k + 1):] * (max_k + 1)
    target_s = tuple((k, timed(target, filler[:k])) for k in range(1, max_k + 2))
    draft_s = tuple((n, timed(draft, filler[:n])) for n in (1, 2))
    target.n_tokens = base
    target.eval(filler[:1])
    samples = []
    target._sampler = target._init_sampler(top_k=1, temp=0.0)  # as generate() keeps one
    for _ in range(repeats):
        t0 = time.perf_counter()
        target.sample(top_k=1, temp=0.0, idx=base)
        samples.append(time.perf_counter() - t0)
    target._sampler = None
    return PassCosts(target_s, draft_s, float(np.median(samples)), base, threads)


# --- acceptance of chains, from a measurement run ---------------------------------------------------


@dataclass(frozen=True)
class ChainAcceptance:
    """Per prompt and depth: top-1 nodes whose parent was accepted (eligible) and those accepted,
    so that resampling prompts gives intervals for any chain length."""

    prompts: np.ndarray  # [P] prompt ids
    domains: np.ndarray  # [P]
    eligible: np.ndarray  # [P, D]
    hits: np.ndarray  # [P, D]

    @classmethod
    def from_nodes(cls, nodes) -> ChainAcceptance:
        from .tune.acceptance import eligible_nodes

        nodes = nodes.sort_values(["prompt_id", "step", "node_id"], kind="stable")
        top1 = nodes[eligible_nodes(nodes) & (nodes["sibling_rank"].to_numpy() == 0)]
        prompts = np.array(sorted(nodes["prompt_id"].unique()))
        depth = int(nodes["depth"].max())
        row = {p: i for i, p in enumerate(prompts)}
        eligible = np.zeros((len(prompts), depth))
        hits = np.zeros((len(prompts), depth))
        r = top1["prompt_id"].map(row).to_numpy()
        d = top1["depth"].to_numpy(np.int64) - 1
        np.add.at(eligible, (r, d), 1)
        np.add.at(hits, (r, d), top1["greedy_accept"].to_numpy(float))
        domain = nodes.groupby("prompt_id")["domain"].first().reindex(prompts).to_numpy()
        return cls(prompts, domain, eligible, hits)

    @property
    def max_k(self) -> int:
        return self.eligible.shape[1]

    def _reach(self, k: int, weights: np.ndarray | None) -> np.ndarray:
        """P(the first d drafts are accepted), d = 1..K, for each row of prompt weights [B, P]."""
        w = np.ones((1, len(self.prompts))) if weights is None else np.atleast_2d(weights)
        rates = (w @ self.hits[:, :k]) / np.maximum(w @ self.eligible[:, :k], 1)
        return np.cumprod(rates, axis=1)

    def tau(self, k: int, weights: np.ndarray | None = None) -> np.ndarray:
        """E[tokens per step] of the top-1 chain of K (accepted drafts + the target's token)."""
        return 1 + self._reach(k, weights).sum(axis=1)

    def p_all(self, k: int, weights: np.ndarray | None = None) -> np.ndarray:
        """P(all K drafts accepted)."""
        return self._reach(k, weights)[:, k - 1] if k > 0 else np.ones(1)

    def predicted_speedup(self, costs: PassCosts, k: int) -> float:
        if k <= 0 or not len(self.prompts):
            return 1.0
        return costs.predicted_speedup(k, float(self.tau(k)[0]), float(self.p_all(k)[0]))

    def subset(self, domain: str) -> ChainAcceptance:
        keep = self.domains == domain
        return ChainAcceptance(self.prompts[keep], self.domains[keep], self.eligible[keep],
                               self.hits[keep])
