"""Distributions and draws: temperature/top-p warping, speculative sampling, Gumbel-top-k.

Pure functions of tensors and a ``torch.Generator``; they know nothing of models or caches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .passes import greedy_token


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


def next_token(
    logits: torch.Tensor, vocab: int, temperature: float, top_p: float, generator: torch.Generator
) -> int:
    """The next token from logits at one context: the argmax at temperature 0, else a draw from
    the warped distribution."""
    if temperature == 0:
        return int(greedy_token(logits[:vocab]))
    probs = warp(logits, vocab, temperature, top_p).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


def speculative_sample(
    p: torch.Tensor, candidates: Sequence[int], q: torch.Tensor | None, generator: torch.Generator
) -> tuple[int | None, int]:
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
