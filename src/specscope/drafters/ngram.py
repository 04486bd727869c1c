"""The model-free n-gram (prompt lookup) drafter: vLLM's ``ngram`` proposer, re-written.

What it is: the proposal rule of vLLM's ``NgramProposer`` (``--speculative-config
'{"method": "ngram", ...}'``) as released in vLLM 0.33.0 (git ``4ba787ec9``), file
``vllm/v1/spec_decode/ngram_proposer.py``, function ``_find_longest_matched_ngram_and_propose_tokens``
(lines 209-295), with its defaults from ``vllm/config/speculative.py`` (lines 1300-1326). vLLM
finds the match with a Knuth-Morris-Pratt scan of the reversed context under numba; this module
computes the same answer with a few numpy passes (one per n-gram length), for any context, any
``min_n <= max_n`` and any ``k`` (the tests check it against vLLM's own cases and against a
brute-force definition).

The rule, for a context ``c`` of ``T`` tokens:

1. ``T < min_n``: no proposal. ``k`` is cut to ``max_model_len - T``; ``k <= 0``: no proposal.
2. The match length ``n`` is the largest ``n <= max_n`` for which the last ``n`` tokens
   ``c[T-n:]`` occur earlier, ending at or before ``c[T-2]`` (the occurrence may overlap the
   suffix itself, never be it). Below ``min_n`` there is no proposal. This is the longest n
   within ``[min_n, max_n]`` that matches: a longer match wins over any number of shorter ones.
3. Among the occurrences of that length the EARLIEST (leftmost) is taken, not the latest.
4. The proposal is the (up to) ``k`` tokens right after that occurrence, cut at the end of the
   context: fewer than ``k`` tokens when the occurrence ends near ``c[T-1]``, never padded.

What it does not do: the batching, the numba threads and the per-request buffers of
``NgramProposer.batch_propose``; the request filter of ``NgramProposer.propose`` (a request with
no sampled token, e.g. in prefill, gets ``[]`` there; a request with ``T >= max_model_len`` gets
``[]`` here too, by rule 1); the GPU variant ``ngram_gpu`` (``ngram_proposer_gpu.py``); suffix
decoding; a tree of several candidates (vLLM's ngram proposes one chain). It never reads a model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .config import DrafterError


def _check_bounds(min_n: int, max_n: int) -> None:
    for name, value in (("min_n", min_n), ("max_n", max_n)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise DrafterError(f"{name} must be an integer >= 1, got {value!r}")
    if min_n > max_n:
        raise DrafterError(f"min_n={min_n} must be <= max_n={max_n}")


def propose_ngram(
    context: Sequence[int] | np.ndarray,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int | None = None,
) -> list[int]:
    """The tokens vLLM's ngram proposer drafts after ``context``: at most ``k``, ``[]`` if none.

    ``context`` is every token so far (prompt and output), oldest first. ``min_n``/``max_n`` are
    ``prompt_lookup_min``/``prompt_lookup_max``, ``k`` is ``num_speculative_tokens`` and
    ``max_model_len`` the model's context limit (None: no limit). See the module docstring for
    the rule.
    """
    _check_bounds(min_n, max_n)
    tokens = np.asarray(context)
    if tokens.ndim != 1:
        raise DrafterError(f"context must be one sequence of token ids, got {tokens.shape}")
    total = tokens.shape[0]
    if total < min_n:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - total)
    if k <= 0:
        return []

    # ends: the indices b <= T-2 at which an occurrence of the context's last n tokens ends,
    # for n = 1, 2, ...: c[b-j] == c[T-1-j] for every j < n. Each pass keeps the ends that
    # also match one token further back; the ends stay sorted, so ends[0] is the earliest.
    ends = np.flatnonzero(tokens[: total - 1] == tokens[total - 1])
    n = 0
    first_end = -1
    while ends.size and n < max_n:
        n += 1
        first_end = int(ends[0])
        if n == max_n:
            break
        ends = ends[ends >= n]
        ends = ends[tokens[ends - n] == tokens[total - 1 - n]]
    if n < min_n:
        return []
    start = first_end + 1
    return tokens[start : start + min(k, total - start)].tolist()
