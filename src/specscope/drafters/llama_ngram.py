"""llama.cpp's ``ngram-simple`` speculation (``llama-server --spec-type ngram-simple``), re-written.

What it is: the draft rule of ``common_ngram_simple_draft`` in ``common/ngram-map.cpp`` (lines
49-112) as llama-cpp-python 0.3.36 vendors llama.cpp (b11312, commit 0c1e57098), with the
draft-length cap of ``common/speculative.cpp`` (``common_speculative_n_max``: M, not
``--spec-draft-n-max``) and of ``tools/server/server-context.cpp`` (``get_n_draft_max``: a draft
never runs past ``n_predict``, which only the output's end cuts, as the replay does). Its two
settings are N, ``--spec-ngram-simple-size-n`` (default 12), and M,
``--spec-ngram-simple-size-m`` (default 48): here N is ``ngram_size`` and M the chain's depth K.

The rule, for a context ``c`` of ``T`` tokens (llama.cpp's ``tokens`` are ``c[:T-1]``, the tokens
in the target's cache, and its ``sampled`` is ``c[T-1]``, the token just sampled):

1. ``T - 1 <= N + M + 1``: no draft.
2. The pattern is the context's last N tokens ``c[T-N:]``. The search runs backwards over start
   positions ``j = T - N - 2, ..., 1`` of ``c`` and stops at the first ``j`` with
   ``c[j:j+N] == pattern``: the LATEST earlier occurrence. Position 0 is never a match, and
   neither is ``j = T - N - 1`` (the occurrence shifted by one token, which llama.cpp skips).
   No occurrence: no draft.
3. The draft is the ``min(M, T - 1 - (j + N))`` tokens that follow it, cut before ``c[T-1]``;
   fewer than N such tokens: no draft.

How it differs from vLLM's rule (:mod:`.ngram`): one n-gram size, not the longest of a range; the
latest occurrence, not the earliest; no draft at all below N tokens of continuation or in short
contexts. The tests check it against a transcription of the C++ loop and against llama-server's
own draft counters on the demo pair.

Measured with a chain of M, the records replay llama.cpp's setting M' (``N <= M' <= M``) as the
chain of M' (its draft is the first M' tokens of M's) wherever the context holds more than
``N + M + 1`` tokens; in shorter contexts M' drafts and M does not. A chain shorter than N is no
llama.cpp setting (it never drafts): ``run``, ``decode``, ``tune`` and policy files refuse it.

It never reads a model, and does not do llama.cpp's other model-free types (``ngram-map-k``,
``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``), which keep state across requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .config import DrafterError


def propose_ngram_simple(
    context: Sequence[int] | np.ndarray, size_n: int, size_m: int
) -> list[int]:
    """The tokens llama.cpp's ngram-simple drafts after ``context`` (prompt and output so far,
    oldest first, the token just sampled last): at most ``size_m``, ``[]`` if none. See the
    module docstring for the rule."""
    for name, value in (("size_n", size_n), ("size_m", size_m)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise DrafterError(f"{name} must be an integer >= 1, got {value!r}")
    tokens = np.asarray(context)
    if tokens.ndim != 1:
        raise DrafterError(f"context must be one sequence of token ids, got {tokens.shape}")
    cached = tokens.shape[0] - 1  # llama.cpp's cur_len: the tokens before the sampled one
    if cached <= size_n + size_m + 1:
        return []
    pattern = tokens[-size_n:]
    # windows starting at 0 .. cached - size_n - 1 lie inside tokens[:cached - 1]
    windows = np.lib.stride_tricks.sliding_window_view(tokens[: cached - 1], size_n)
    hits = np.flatnonzero((windows[1:] == pattern).all(axis=1)) + 1  # position 0 never matches
    if not len(hits):
        return []
    start = int(hits[-1]) + size_n
    copy = min(size_m, cached - start)
    if copy < size_n:
        return []
    return [int(t) for t in tokens[start : start + copy]]
