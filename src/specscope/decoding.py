"""Speculative decoding over draft trees: draft -> verify -> accept -> commit (README: "Speculative decoding for real").

One step, for a context of L tokens whose first L - 1 sit in both KV caches:

    draft   -> feed the draft the tokens its cache lacks, then grow the tree level by level, each
               level's frontier in ONE batched call (4D tree mask, positions L + depth - 1)
    verify  -> the target scores the last context token and every tree node in ONE pass
    accept  -> greedy (temperature 0): follow the child whose token is the target's argmax; the
               first context without such a child emits the target's argmax there (the bonus).
               Sampling: multi-round speculative sampling at each node (SpecInfer), which
               leaves the target's (temperature, top-p) distribution unchanged
    commit  -> keep the accepted path's cache entries, drop the rest (gather along the sequence)

Greedy verification is lossless: the output is the target's plain greedy output, token for token
(up to floating-point ties between the tree pass and one-token passes).

Tree policies: any static :class:`~specscope.trees.TreeShape` (``chain``, ``static``, ``paper``,
``optimal``), EAGLE-2-style :class:`~specscope.policies.DynamicTree`, or ``None`` (plain decoding).
With sampling, a static tree's children are drawn from the draft without replacement
(Gumbel-top-k) and verified against the draft's distribution; a dynamic tree's children are the
draft's top tokens (deterministic), verified as point-mass proposals, which keeps it lossless
although its shape depends on the draft's probabilities.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import torch

from .engine import crop, feed, greedy_token, grow_tree
from .policies import CostModel, DynamicTree, Speculation
from .trees import TreeShape

from .errors import SpecscopeError


class DecodeError(SpecscopeError, ValueError):
    """A decoding request that cannot be served; the message says why."""


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0
    min_path_prob: float = 0.0  # stop growing the tree when no frontier path is this likely (draft)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise DecodeError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise DecodeError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DecodeError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_path_prob < 1:
            raise DecodeError(f"min_path_prob must be in [0, 1), got {self.min_path_prob}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class DecodeStep:
    """One verification step (or one plain-decoding token)."""

    step: int
    context_len: int
    tree_size: int
    accepted_len: int  # tree nodes accepted
    tau: int  # tokens this step emitted: accepted_len + 1 (before truncation at EOS / budget)
    draft_time_s: float
    verify_time_s: float
    step_time_s: float


@dataclass
class DecodeResult:
    tokens: list[int]  # generated tokens (an EOS that stopped generation included)
    steps: list[DecodeStep]
    stop_reason: str  # "eos" or "max_new_tokens"
    time_s: float
    prompt_tokens: int

    @property
    def mean_tau(self) -> float:
        return sum(s.tau for s in self.steps) / len(self.steps) if self.steps else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.time_s if self.time_s > 0 else float("nan")


# --- distributions -----------------------------------------------------------------------------


def warp(logits: torch.Tensor, vocab: int, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities [..., vocab] at ``temperature`` (> 0), restricted to the top-p nucleus."""
    probs = torch.softmax(logits[..., :vocab].float() / temperature, dim=-1)
    if top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = (sorted_p.cumsum(-1) - sorted_p) >= top_p  # mass before a token already >= p
        sorted_p[outside] = 0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs /= probs.sum(-1, keepdim=True)
    return probs


def speculative_sample(p: torch.Tensor, candidates: Sequence[int], q: torch.Tensor | None,
                       generator: torch.Generator) -> tuple[int | None, int]:
    """Multi-round speculative sampling at one node: returns (accepted candidate index or None,
    emitted token); the emitted token is distributed exactly as ``p`` [V].

    ``q`` [V] is the draft distribution the candidates were drawn from, without replacement, in
    order; ``None`` means deterministic candidates (point-mass proposals). Round i proposes
    candidate x ~ q_i (q without earlier candidates, renormalised) against the residual r:
      - accept x with probability min(1, r(x) / q_i(x))
      - else r <- normalise(max(0, r - q_i)) and try the next candidate
      - after the last rejection, sample the emitted token from r.
    """
    residual = p.double().clone()
    remaining = None if q is None else q.double().clone()
    for i, x in enumerate(candidates):
        if remaining is None:
            proposal = torch.zeros_like(residual)
            proposal[x] = 1.0
        else:
            if remaining[x] <= 0:  # cannot have been drawn (the draft gave it no mass): skip
                continue
            proposal = remaining / remaining.sum()
        u = torch.rand((), generator=generator, dtype=torch.float64)
        if u * proposal[x] < residual[x]:
            return i, x
        residual = (residual - proposal).clamp_min(0)
        total = residual.sum()
        if total <= 0:  # r == q_i: x was certain to be accepted; numerical corner
            return i, x
        residual /= total
        if remaining is not None:
            remaining[x] = 0
    return None, int(torch.multinomial(residual.float(), 1, generator=generator))


def gumbel_topk_scores(q: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """log q + Gumbel noise: its top-k are k draws from q without replacement, in draw order."""
    u = torch.rand(q.shape, generator=generator).clamp_(1e-20, 1.0).to(q.device)
    return torch.log(q) - torch.log(-torch.log(u))


# --- KV caches -----------------------------------------------------------------------------------


def _layer_tensors(cache) -> list[tuple[object, str]]:
    """(holder, attribute) of every key and value tensor, for old and new ``DynamicCache``."""
    if hasattr(cache, "layers"):
        out = []
        for layer in cache.layers:
            if hasattr(layer, "cumulative_length") or getattr(layer, "is_sliding", False):
                raise DecodeError(f"cache layer {type(layer).__name__} (sliding window) cannot "
                                  "keep selected positions; use a full-attention model")
            out += [(layer, "keys"), (layer, "values")]
        return out
    return [(lst, i) for lst in (cache.key_cache, cache.value_cache) for i in range(len(lst))]


def keep_positions(cache, keep: Sequence[int]) -> None:
    """Keep only the cache entries at sequence positions ``keep`` (increasing), in every layer."""
    keep = list(keep)
    start = next((i for i, k in enumerate(keep) if k != i), len(keep))
    if start < len(keep):
        for holder, key in _layer_tensors(cache):
            t = holder[key] if isinstance(key, int) else getattr(holder, key)
            if t is None or t.numel() == 0:
                continue
            index = torch.tensor(keep[start:], device=t.device)
            t[..., start:len(keep), :] = t.index_select(-2, index)
    crop(cache, len(keep))


@lru_cache(maxsize=256)
def bfs_prefix(shape: TreeShape, size: int) -> TreeShape:
    """The first ``size`` nodes of a breadth-first shape (itself a tree)."""
    return shape if size >= len(shape) else TreeShape(shape.parents[:size], shape.ranks[:size])


@lru_cache(maxsize=256)
def cut_depth(shape: TreeShape, depth: int) -> TreeShape:
    """The nodes of ``shape`` no deeper than ``depth``."""
    return bfs_prefix(shape, sum(1 for d in shape.depths if d <= depth))


@lru_cache(maxsize=64)
def contiguous_ranks(shape: TreeShape) -> TreeShape:
    """The same tree with each node's children ranked 0, 1, ... in their rank order."""
    ranks = list(shape.ranks)
    for kids in (shape.nodes_at_depth(1),) + shape.children:
        for new, n in enumerate(sorted(kids, key=lambda c: shape.ranks[c])):
            ranks[n] = new
    return TreeShape(shape.parents, tuple(ranks))


# --- the decoder -----------------------------------------------------------------------------------


@dataclass
class DraftTree:
    """The tree one step drafted."""

    shape: TreeShape
    tokens: torch.Tensor  # [N] long, on the CPU
    proposals: torch.Tensor | None  # [C, V]: the q rows nodes were drawn from; None: top tokens
    proposal_row: list[int]  # each node's row of ``proposals`` (its parent's context)
    draft_slot: list[int]  # each node's index among the tree entries of the draft cache, or -1


@dataclass
class _Session:
    """One prompt's decoding state: the context and both caches.

    After the first token the target cache holds ``tokens[:-1]``; the draft cache holds
    ``tokens[:draft_len]``. ``first_logits``: the target's logits at the end of the prompt.
    """

    tokens: list[int]
    target_cache: object
    draft_cache: object
    draft_len: int
    generator: torch.Generator
    first_logits: torch.Tensor
    steps: list[DecodeStep] = field(default_factory=list)


@dataclass
class SpeculativeDecoder:
    draft: torch.nn.Module
    target: torch.nn.Module
    vocab: int
    eos: frozenset[int] = frozenset()

    # prefill ----------------------------------------------------------------------------------

    def _start(self, prompt: Sequence[int], config: DecodeConfig, depth: int) -> _Session:
        from transformers import DynamicCache

        if not prompt:
            raise DecodeError("the prompt has no tokens")
        limit = min(getattr(m.config, "max_position_embeddings", 1 << 30)
                    for m in (self.draft, self.target))
        need = len(prompt) + config.max_new_tokens + depth
        if need > limit:
            raise DecodeError(
                f"the prompt ({len(prompt)} tokens) + max_new_tokens ({config.max_new_tokens}) + "
                f"the tree's depth ({depth}) need {need} positions; the models allow {limit}")
        target_cache = DynamicCache(config=self.target.config)
        draft_cache = DynamicCache(config=self.draft.config)
        ids = torch.tensor([list(prompt)], device=self.target.device)
        logits = self.target(input_ids=ids, past_key_values=target_cache, use_cache=True,
                             logits_to_keep=1).logits[0, -1, :self.vocab]
        if len(prompt) > 1:
            self.draft(input_ids=ids[:, :-1].to(self.draft.device), past_key_values=draft_cache,
                       use_cache=True, logits_to_keep=1)
        return _Session(list(prompt), target_cache, draft_cache, len(prompt) - 1,
                        torch.Generator().manual_seed(config.seed), first_logits=logits)

    # draft --------------------------------------------------------------------------------------

    def _draft_root(self, s: _Session) -> torch.Tensor:
        """Feed the draft the tokens its cache lacks; logits [V] at the whole context."""
        new = s.tokens[s.draft_len:]
        causal = torch.ones(len(new), len(new), dtype=torch.bool).tril()
        past = torch.ones(len(new), s.draft_len, dtype=torch.bool)
        logits = feed(self.draft, s.draft_cache, new, torch.arange(s.draft_len, len(s.tokens)),
                      past, causal, last=1)
        s.draft_len = len(s.tokens)
        return logits[-1, :self.vocab].float()

    def _draft_level(self, s: _Session, nodes: list[int], tokens: torch.Tensor, parents: list[int],
                     depths: list[int], fed: list[int]) -> torch.Tensor:
        """Feed ``nodes`` (one tree level) to the draft in one call; their logits [F, V]."""
        def ancestors(n: int) -> set[int]:
            out = set()
            while n >= 0:
                out.add(n)
                n = parents[n]
            return out

        anc = [ancestors(n) for n in nodes]
        L = len(s.tokens)
        visible = torch.cat([torch.ones(len(nodes), L, dtype=torch.bool),
                             torch.tensor([[f in a for f in fed] for a in anc], dtype=torch.bool)
                             .view(len(nodes), len(fed))], dim=1)
        block = torch.tensor([[m in a for m in nodes] for a in anc], dtype=torch.bool)
        positions = torch.tensor([L + depths[n] - 1 for n in nodes])
        logits = feed(self.draft, s.draft_cache, tokens[nodes], positions, visible, block)
        fed.extend(nodes)
        return logits[:, :self.vocab].float()

    def _draft_static(self, s: _Session, shape: TreeShape, config: DecodeConfig) -> DraftTree:
        """Children are the draft's top tokens (greedy) or draws without replacement (sampling).
        Growth stops early once no frontier path has draft probability ``min_path_prob``."""
        fed: list[int] = []  # nodes in the draft cache, in order; context row of node n: 1 + index
        rows: list[torch.Tensor] = []  # draft distribution at the root and at each fed node (sampling, min_path_prob)
        path_prob: dict[int, float] = {-1: 1.0}

        def scores(logits: torch.Tensor) -> torch.Tensor:
            if config.greedy and not config.min_path_prob:
                return logits  # the top tokens; no distribution needed
            temperature = config.temperature or 1.0
            q = warp(logits, self.vocab, temperature, 1.0 if config.greedy else config.top_p)
            rows.extend(q)
            return q if config.greedy else gumbel_topk_scores(q, s.generator)

        def expand(frontier: list[int], tokens: torch.Tensor) -> torch.Tensor:
            return scores(self._draft_level(s, frontier, tokens.cpu(), list(shape.parents),
                                            list(shape.depths), fed))

        def unlikely(frontier: list[int], tokens: torch.Tensor) -> bool:
            for n in frontier:
                parent = shape.parents[n]
                row = rows[0 if parent < 0 else 1 + fed.index(parent)]
                path_prob[n] = path_prob[parent] * float(row[tokens[n]])
            return max(path_prob[n] for n in frontier) < config.min_path_prob

        if not config.greedy:  # draws are taken in order: a node's children are draws 0..k-1
            shape = contiguous_ranks(shape)
        tokens, _, q_index = grow_tree(shape, scores(self._draft_root(s)[None]), expand,
                                       stop=unlikely if config.min_path_prob > 0 else None)
        shape = bfs_prefix(shape, len(tokens))
        slot = {n: i for i, n in enumerate(fed)}
        return DraftTree(shape, tokens.cpu(), None if config.greedy else torch.stack(rows),
                         q_index.tolist(), [slot.get(n, -1) for n in range(len(shape))])

    def _draft_dynamic(self, s: _Session, policy: DynamicTree, config: DecodeConfig) -> DraftTree:
        """EAGLE-2: expand the top-k nodes of each depth by cumulative draft log-probability, then
        keep the best ``max_nodes`` of all drafted nodes (ties: shallower first)."""
        temp = config.temperature or 1.0
        logq = torch.log_softmax(self._draft_root(s) / temp, -1)
        parents: list[int] = []
        depths: list[int] = []
        ranks: list[int] = []
        score: list[float] = []
        token_list: list[int] = []
        fed: list[int] = []

        def add_children(parent: int, row: torch.Tensor) -> list[int]:
            top = torch.topk(row, policy.top_k)
            base = score[parent] if parent >= 0 else 0.0
            first = len(parents)
            for r, (lp, tok) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                parents.append(parent)
                depths.append(1 if parent < 0 else depths[parent] + 1)
                ranks.append(r)
                score.append(base + lp)
                token_list.append(tok)
            return list(range(first, len(parents)))

        level = add_children(-1, logq)
        for _ in range(policy.depth - 1):
            frontier = sorted(level, key=lambda n: -score[n])[:policy.top_k]
            if math.exp(score[frontier[0]]) < config.min_path_prob:
                break
            rows = torch.log_softmax(self._draft_level(
                s, frontier, torch.tensor(token_list), parents, depths, fed) / temp, -1)
            level = [c for n, row in zip(frontier, rows) for c in add_children(n, row)]
        kept = sorted(range(len(parents)), key=lambda n: (-score[n], depths[n], n))[:policy.max_nodes]
        return self._as_tree(kept, parents, depths, ranks, token_list, fed)

    @staticmethod
    def _as_tree(kept, parents, depths, ranks, token_list, fed) -> DraftTree:
        """The kept candidates as a breadth-first :class:`TreeShape` and its buffers."""
        order = sorted(kept, key=lambda n: (depths[n], n))
        index = {n: i for i, n in enumerate(order)}
        shape = TreeShape(tuple(index[parents[n]] if parents[n] >= 0 else -1 for n in order),
                          tuple(ranks[n] for n in order))
        slot = {n: i for i, n in enumerate(fed)}
        return DraftTree(shape, torch.tensor([token_list[n] for n in order]), None, [],
                         [slot.get(n, -1) for n in order])

    # verify -------------------------------------------------------------------------------------

    def _verify(self, s: _Session, tree: DraftTree) -> torch.Tensor:
        """Target logits [1 + N, V] at the context and at the context extended by each node."""
        L, N = len(s.tokens), len(tree.shape)
        assert s.target_cache.get_seq_length() == L - 1, "the target cache must hold tokens[:-1]"
        anc = tree.shape.ancestor_mask()
        visible = torch.ones(1 + N, L - 1, dtype=torch.bool)
        block = torch.zeros(1 + N, 1 + N, dtype=torch.bool)
        block[:, 0] = True
        block[1:, 1:] = anc
        ids = torch.cat([torch.tensor(s.tokens[-1:]), tree.tokens])
        positions = torch.cat([torch.tensor([L - 1]), L + torch.tensor(tree.shape.depths) - 1])
        logits = feed(self.target, s.target_cache, ids, positions, visible, block)
        return logits[:, :self.vocab]

    # accept -------------------------------------------------------------------------------------

    @staticmethod
    def _children(shape: TreeShape, node: int) -> tuple[int, ...]:
        if node < 0:
            return tuple(n for n, p in enumerate(shape.parents) if p < 0)
        return shape.children[node]

    def _accept_greedy(self, tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
        """Follow the child equal to the target's argmax; the first miss is the bonus token."""
        best = greedy_token(logits).tolist()  # [1 + N]
        tokens = tree.tokens.tolist()
        path, node = [], -1
        while True:
            match = [c for c in self._children(tree.shape, node) if tokens[c] == best[node + 1]]
            if not match:
                return path, best[node + 1]
            node = match[0]
            path.append(node)

    def _accept_sampled(self, tree: DraftTree, logits: torch.Tensor, config: DecodeConfig,
                        generator: torch.Generator) -> tuple[list[int], int]:
        """Speculative sampling node by node, down the tree, until a round emits its own token."""
        p = warp(logits, self.vocab, config.temperature, config.top_p).cpu()
        tokens = tree.tokens.tolist()
        path, node = [], -1
        while True:
            kids = sorted(self._children(tree.shape, node), key=lambda c: tree.shape.ranks[c])
            q = (tree.proposals[tree.proposal_row[kids[0]]].cpu()
                 if tree.proposals is not None and kids else None)
            index, token = speculative_sample(p[node + 1], [tokens[c] for c in kids], q, generator)
            if index is None:
                return path, token
            node = kids[index]
            path.append(node)

    # commit -------------------------------------------------------------------------------------

    def _commit(self, s: _Session, tree: DraftTree, path: list[int], bonus: int) -> list[int]:
        """Keep the accepted path in both caches; append its tokens and the bonus token."""
        L = len(s.tokens)
        keep_positions(s.target_cache, list(range(L)) + [L + n for n in path])
        in_draft = []
        for n in path:  # the draft holds a prefix of the path (nodes it fed to grow children)
            if tree.draft_slot[n] < 0:
                break
            in_draft.append(L + tree.draft_slot[n])
        keep_positions(s.draft_cache, list(range(L)) + in_draft)
        s.draft_len = L + len(in_draft)
        emitted = [int(tree.tokens[n]) for n in path] + [int(bonus)]
        s.tokens.extend(emitted)
        return emitted

    # the loop -----------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, prompt: Sequence[int], spec: Speculation,
                 config: DecodeConfig = DecodeConfig()) -> DecodeResult:
        """Decode ``prompt`` with speculation ``spec`` (None: plain decoding)."""
        if spec is None:
            return plain_generate(self.target, prompt, config, self.vocab, self.eos)
        t_start = time.perf_counter()
        s = self._start(prompt, config, spec.max_depth)
        first = next_token(s.first_logits, self.vocab, config, s.generator)  # as plain decoding does
        s.tokens.append(first)
        prefill_s = time.perf_counter() - t_start
        s.steps.append(DecodeStep(0, len(prompt), 0, 0, 1, 0.0, prefill_s, prefill_s))
        out, stop = _append([], [first], config.max_new_tokens, self.eos)
        while len(out) < config.max_new_tokens and stop != "eos":
            t0 = time.perf_counter()
            depth = max(1, config.max_new_tokens - len(out) - 1)  # the bonus token is free
            tree = (self._draft_dynamic(s, replace(spec, depth=min(spec.depth, depth)), config)
                    if isinstance(spec, DynamicTree)
                    else self._draft_static(s, cut_depth(spec, depth), config))
            t1 = time.perf_counter()
            logits = self._verify(s, tree)
            t2 = time.perf_counter()
            path, bonus = (self._accept_greedy(tree, logits) if config.greedy
                           else self._accept_sampled(tree, logits, config, s.generator))
            context_len = len(s.tokens)
            emitted = self._commit(s, tree, path, bonus)
            s.steps.append(DecodeStep(len(s.steps), context_len, len(tree.shape), len(path),
                                      len(emitted), t1 - t0, t2 - t1, time.perf_counter() - t0))
            out, stop = _append(out, emitted, config.max_new_tokens, self.eos)
        return DecodeResult(out, s.steps, stop, time.perf_counter() - t_start, len(prompt))


def _append(out: list[int], emitted: list[int], budget: int, eos) -> tuple[list[int], str]:
    """Extend ``out`` with ``emitted``, cut after the first EOS or at the token budget."""
    for token in emitted:
        if len(out) == budget:
            break
        out = out + [token]
        if token in eos:
            return out, "eos"
    return out, "max_new_tokens"


def next_token(logits: torch.Tensor, vocab: int, config: DecodeConfig,
               generator: torch.Generator) -> int:
    """The target's next token from its logits at a context: argmax, or a draw from the warped
    distribution."""
    if config.greedy:
        return int(greedy_token(logits[:vocab]))
    probs = warp(logits, vocab, config.temperature, config.top_p).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.inference_mode()
def plain_generate(model: torch.nn.Module, prompt: Sequence[int], config: DecodeConfig,
                   vocab: int, eos=frozenset()) -> DecodeResult:
    """Token-by-token decoding with a KV cache: greedy, or sampling at ``config.temperature``."""
    from transformers import DynamicCache

    if not prompt:
        raise DecodeError("the prompt has no tokens")
    t_start = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(prompt)], device=model.device)
    out: list[int] = []
    steps: list[DecodeStep] = []
    stop = "max_new_tokens"
    while len(out) < config.max_new_tokens:
        t0 = time.perf_counter()
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[0, -1]
        token = next_token(logits, vocab, config, generator)
        t1 = time.perf_counter()
        steps.append(DecodeStep(len(steps), len(prompt) + len(out), 0, 0, 1, 0.0, t1 - t0, t1 - t0))
        out.append(token)
        if token in eos:
            stop = "eos"
            break
        ids = torch.tensor([[token]], device=model.device)
    return DecodeResult(out, steps, stop, time.perf_counter() - t_start, len(prompt))


def steps_frame(result: DecodeResult):
    """The per-step records as a DataFrame."""
    import pandas as pd

    return pd.DataFrame([vars(s) for s in result.steps])


def make_decoder(pair) -> SpeculativeDecoder:
    """The decoder of a loaded :class:`~specscope.models.ModelPair`."""
    from .runner import eos_token_ids

    return SpeculativeDecoder(pair.draft.model, pair.target.model, pair.vocab_size,
                              frozenset(eos_token_ids(pair)))


# --- cost model ----------------------------------------------------------------------------------

COST_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)


def _time_forward(model, cache, base: int, k: int, repeats: int, vocab: int) -> float:
    """Median seconds of one forward of ``k`` tokens over a cache of ``base`` entries."""
    times = []
    for _ in range(repeats):
        ids = torch.randint(0, vocab, (k,))
        t0 = time.perf_counter()
        feed(model, cache, ids, torch.arange(base, base + k), torch.ones(k, base, dtype=torch.bool),
             torch.ones(k, k, dtype=torch.bool).tril())
        times.append(time.perf_counter() - t0)
        crop(cache, base)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def measure_costs(decoder: SpeculativeDecoder, context_len: int = 256,
                  sizes: Sequence[int] = COST_SIZES, repeats: int = 3,
                  hardware: str = "") -> CostModel:
    """Time draft and target forwards by tokens fed, plain decoding per token, and the per-step
    bookkeeping of a real speculative decode, over a synthetic context of ``context_len``."""
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, min(decoder.vocab, 1000), (context_len,), generator=generator).tolist()
    tables = []
    for model in (decoder.draft, decoder.target):
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([context], device=model.device), past_key_values=cache,
              use_cache=True, logits_to_keep=1)
        _time_forward(model, cache, context_len, 1, 1, decoder.vocab)  # warm-up
        tables.append(tuple((k, _time_forward(model, cache, context_len, k, repeats, decoder.vocab)) for k in sizes))
    config = DecodeConfig(max_new_tokens=16)
    plain = plain_generate(decoder.target, context, config, decoder.vocab)
    per_token = sorted(s.step_time_s for s in plain.steps[1:])[len(plain.steps[1:]) // 2]
    model = CostModel(draft_s=tables[0], target_s=tables[1], plain_token_s=per_token,
                      context_len=context_len, hardware=hardware or _hardware())
    # What a real step costs beyond the timed forwards (bookkeeping, cache gathers, the growing
    # context): the median of real step times minus the model's prediction for them.
    chain = TreeShape.from_paths([(0,), (0, 0)])
    steps = decoder.generate(context, chain, config).steps[2:]  # after the prefill and one step
    residual = sorted(s.step_time_s - model.step_time(chain) for s in steps)
    return replace(model, overhead_s=max(0.0, residual[len(residual) // 2]) if residual else 0.0)


def _hardware() -> str:
    import platform

    return f"{platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} threads".strip()


# --- bench -----------------------------------------------------------------------------------------

BENCH_METHODS = ("plain", "assisted", "chain", "uniform", "routed", "dynamic")


@dataclass(frozen=True)
class BenchConfig:
    """What ``specscope bench`` times: every method on every prompt ``repeats`` times (methods
    interleaved within a repeat, so that noise hits them alike), after ``warmup`` untimed rounds of
    every method on the first prompt; medians are kept."""

    max_new_tokens: int = 48
    warmup: int = 1
    repeats: int = 3
    chain_depth: int = 4
    min_path_prob: float = 0.0  # see DecodeConfig; for the specscope methods
    methods: tuple[str, ...] = ("plain", "assisted", "chain", "uniform", "routed")
    dynamic: DynamicTree = DynamicTree()
    chat_template: bool = True
    max_prompt_tokens: int = 512

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in BENCH_METHODS]
        if unknown:
            raise DecodeError(f"unknown bench method(s) {unknown}; choose from {', '.join(BENCH_METHODS)}")
        if "plain" not in self.methods:
            raise DecodeError("the bench needs the 'plain' method: it is the reference")
        if self.repeats < 1 or self.warmup < 0 or self.max_new_tokens < 1 or self.chain_depth < 1:
            raise DecodeError("repeats, max_new_tokens and chain_depth must be >= 1, warmup >= 0")


@dataclass(frozen=True)
class BenchRun:
    """One method on one prompt: the output, and the median time over the repeats."""

    method: str
    prompt_id: str
    domain: str
    routed_to: str  # the router's domain (routed method), else ""
    tokens: tuple[int, ...]
    steps: int  # verification steps (forward passes of the target for plain)
    time_s: float
    first_token_s: float  # the prompt's prefill and the first token (the same work in every method)


@dataclass(frozen=True)
class BenchRow:
    method: str
    domain: str  # or "all"
    prompts: int
    tokens: int
    time_s: float
    tokens_per_s: float  # end to end, the prefill included
    decode_tokens_per_s: float  # after the first token: the part speculation changes
    speedup: float  # decode tokens per second over plain's, same prompts
    e2e_speedup: float  # end-to-end tokens per second over plain's
    tau: float  # tokens per verification step (nan where not observed)
    exact: bool  # every output equals plain greedy's


class _FirstTokenClock:
    """A transformers streamer that notes when the first new token arrives."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.calls = 0
        self.first_token_s = float("nan")

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first_token_s = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def _hf_generate(model, prompt: list[int], max_new_tokens: int, eos: frozenset[int],
                 assistant=None) -> tuple[list[int], float]:
    """``model.generate``, greedy (with ``assistant``: transformers assisted generation); the
    tokens and the seconds to the first one."""
    ids = torch.tensor([prompt], device=model.device)
    eos_ids = sorted(eos) or None
    clock = _FirstTokenClock()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos_ids, streamer=clock,
                         pad_token_id=eos_ids[0] if eos_ids else None, assistant_model=assistant)
    return out[0, len(prompt):].tolist(), clock.first_token_s


def bench_methods(decoder: SpeculativeDecoder, policy, router, config: BenchConfig) -> dict:
    """method -> fn(prompt ids, prompt text) -> (tokens, steps, routed domain, first-token s)."""
    greedy = DecodeConfig(max_new_tokens=config.max_new_tokens, min_path_prob=config.min_path_prob)

    def run(spec):
        def fn(ids, text):
            r = decoder.generate(ids, spec, greedy)
            return r.tokens, len(r.steps), "", r.steps[0].step_time_s
        return fn

    def routed(ids, text):
        domain = router.classify(text)
        r = decoder.generate(ids, policy.tree_for(domain), greedy)
        return r.tokens, len(r.steps), domain, r.steps[0].step_time_s

    def hf(assistant):
        def fn(ids, text):  # plain: one target pass per token; assisted: steps not observed
            tokens, first = _hf_generate(decoder.target, ids, config.max_new_tokens, decoder.eos,
                                         assistant)
            return tokens, len(tokens) if assistant is None else 0, "", first
        return fn

    chain = TreeShape.from_paths([(0,) * d for d in range(1, config.chain_depth + 1)])
    table = {"plain": hf(None), "assisted": hf(decoder.draft), "chain": run(chain),
             "uniform": run(policy.uniform if policy else chain), "routed": routed,
             "dynamic": run(config.dynamic)}
    if policy is None and ("uniform" in config.methods or "routed" in config.methods):
        raise DecodeError("methods 'uniform' and 'routed' need a policy file (specscope tune)")
    return {m: table[m] for m in config.methods}


def run_bench(decoder: SpeculativeDecoder, tokenizer, items, policy, router,
              config: BenchConfig = BenchConfig(), log=None) -> list[BenchRun]:
    """Time every method on every prompt; medians over ``repeats`` (see :class:`BenchConfig`)."""
    from .router import prompt_text
    from .runner import render_prompt

    methods = bench_methods(decoder, policy, router, config)
    rendered = [render_prompt(tokenizer, item.messages, config.chat_template,
                              config.max_prompt_tokens).ids for item in items]
    for _ in range(config.warmup if items else 0):
        for fn in methods.values():
            fn(rendered[0], prompt_text(items[0]))
    runs = []
    for i, (item, ids) in enumerate(zip(items, rendered)):
        text = prompt_text(item)
        times: dict[str, list[float]] = {m: [] for m in methods}
        firsts: dict[str, list[float]] = {m: [] for m in methods}
        outputs: dict[str, tuple] = {}
        for _ in range(config.repeats):
            for name, fn in methods.items():
                t0 = time.perf_counter()
                outputs[name] = fn(ids, text)
                times[name].append(time.perf_counter() - t0)
                firsts[name].append(outputs[name][3])
        for name in methods:
            tokens, steps, routed, _ = outputs[name]
            median = sorted(times[name])[len(times[name]) // 2]
            first = sorted(firsts[name])[len(firsts[name]) // 2]
            runs.append(BenchRun(name, item.id, item.domain, routed, tuple(tokens), steps, median,
                                 first))
            if log:
                log(f"[{i + 1}/{len(items)}] {item.domain:9s} {name:9s} {len(tokens):3d} tokens "
                    f"{median:6.2f} s {len(tokens) / median:6.2f} tok/s"
                    + (f" (routed: {routed})" if routed else ""))
    return runs


def summarize_bench(runs: Sequence[BenchRun]) -> list[BenchRow]:
    """Per method and domain (and ``all``): tokens per second end to end and after the first
    token, speed-ups over plain, tau, exactness. Totals over prompts: tokens / seconds."""
    reference = {r.prompt_id: r.tokens for r in runs if r.method == "plain"}
    domains = list(dict.fromkeys(r.domain for r in runs))

    def rates(part: list[BenchRun]) -> tuple[float, float]:
        secs = sum(r.time_s for r in part)
        decode_secs = sum(r.time_s - r.first_token_s for r in part if r.tokens)
        tokens = sum(len(r.tokens) for r in part)
        later = sum(len(r.tokens) - 1 for r in part if r.tokens)
        return (tokens / secs if secs else float("nan"),
                later / decode_secs if decode_secs > 0 else float("nan"))

    rows = []
    for domain in domains + ["all"]:
        part = [r for r in runs if domain in ("all", r.domain)]
        plain_tps, plain_decode = rates([r for r in part if r.method == "plain"])
        for method in dict.fromkeys(r.method for r in part):
            mine = [r for r in part if r.method == method]
            tps, decode = rates(mine)
            tokens = sum(len(r.tokens) for r in mine)
            steps = sum(r.steps for r in mine)
            rows.append(BenchRow(method, domain, len(mine), tokens, sum(r.time_s for r in mine),
                                 tps, decode, decode / plain_decode, tps / plain_tps,
                                 tokens / steps if steps else float("nan"),
                                 all(r.tokens == reference[r.prompt_id] for r in mine)))
    return rows
