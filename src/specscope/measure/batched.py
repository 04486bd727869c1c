"""Batched measurement: B prompts measured together, with the same records as one at a time.

Each step of :class:`BatchedEngine` does for all B prompts what the draft and verify stages of
the speculation loop (:mod:`specscope.core.loop`) do for one:
one draft call feeds every prompt's newest context token, one draft call per depth drafts every
prompt's frontier, and one target pass scores every prompt's tree. The prompts' contexts have
different lengths; both models keep one batched KV cache in which each row holds its prompt's
entries right-aligned after padding slots, ``valid`` [B, T] marks which cache slots are real, and
every pass gets explicit position ids and a 4D mask per row, so a row attends to exactly what it
would attend to alone. Tree entries are appended to all rows at the same slots and cropped after
the step, as in the one-prompt loop.

When a prompt finishes (EOS or its token budget), its row is refilled with the next prompt: the new
prompt is prefilled alone and the caches are repacked (valid entries only, right-aligned), which
also drops the padding that finished prompts leave behind; rows without a next prompt are dropped.

The records of a step are built by the same :func:`~specscope.measure.records.step_record` from the same
distributions, so they equal the one-prompt loop's up to floating-point rounding of batched
kernels (float32: probabilities within 1e-5; tests compare them), and exactly with the
batch-invariant int8 pair. This module does not write records; :mod:`specscope.measure.study` commits each
prompt as it finishes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..core.draft import grow_tree
from ..core.passes import additive_mask, crop, new_cache, prefill, softmax
from ..trees import TreeShape
from .records import StepScores


@dataclass
class Row:
    """One prompt in flight: its context and what the caller keeps with it."""

    context: list[int]
    payload: object  # the caller's state for this prompt (records so far, item, ...)


def _positions(lengths: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """[B, Q] position ids: each row's context length plus per-token offsets [Q]."""
    return lengths[:, None] + offsets[None, :]


@dataclass
class BatchedEngine:
    """Draft -> verify for B prompts at once, over one batched KV cache per model."""

    draft: torch.nn.Module
    target: torch.nn.Module
    vocab: int
    rows: list[Row] = field(default_factory=list)
    _caches: tuple = field(default=(None, None), init=False)
    _valid: torch.Tensor | None = field(default=None, init=False)  # [B, T] bool

    # --- rows in and out ---------------------------------------------------------------------

    @torch.inference_mode()
    def replace_rows(self, keep: list[int], new: list[Row]) -> None:
        """Keep the rows at indices ``keep`` (in that order), append ``new`` rows (prefilled
        here), and repack both caches: valid entries only, right-aligned."""
        fresh = [[prefill(m, row.context[:-1])[0] for m in (self.draft, self.target)] for row in new]
        lengths = [int(self._valid[i].sum()) for i in keep] + [len(r.context) - 1 for r in new]
        width = max(lengths, default=0)
        caches = []
        for m, model in enumerate((self.draft, self.target)):
            packed = new_cache(model)
            if width:
                for index, layer in enumerate(packed.layers):
                    kv = []
                    for name in ("keys", "values"):
                        rows = [getattr(self._caches[m].layers[index], name)[i].index_select(
                            1, self._valid[i].nonzero().flatten().to(model.device)) for i in keep]
                        rows += [getattr(f[m].layers[index], name)[0]
                                 if f[m].layers[index].get_seq_length() else None for f in fresh]
                        ref = next(t for t in rows if t is not None and t.shape[1])
                        rows = [ref[:, :0] if t is None else t for t in rows]
                        kv.append(torch.stack([torch.cat([ref.new_zeros(
                            ref.shape[0], width - t.shape[1], ref.shape[2]), t], dim=1)
                            for t in rows]))
                    layer.lazy_initialization(*kv)
                    layer.keys, layer.values = kv
            caches.append(packed)
        valid = torch.zeros(len(lengths), width, dtype=torch.bool)
        for r, n in enumerate(lengths):
            valid[r, width - n:] = True
        self._valid = valid
        self._caches = tuple(caches)
        self.rows = [self.rows[i] for i in keep] + list(new)

    # --- one step for every row ----------------------------------------------------------------

    def _feed(self, model, cache, ids: torch.Tensor, positions: torch.Tensor,
              past: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """ids [B, Q] over the batched cache; ``past`` [B, Q, T] and ``block`` [Q, Q] (the same
        for every row) say what each new token sees. Logits [B, Q, V']."""
        dev = model.device
        B, Q = ids.shape
        masks = torch.stack([additive_mask(past[b].to(dev), block.to(dev), model.dtype)[0]
                             for b in range(B)])
        out = model(input_ids=ids.to(dev), past_key_values=cache, use_cache=True,
                    attention_mask=masks, position_ids=positions.to(dev))
        return out.logits

    @torch.inference_mode()
    def score(self, shape: TreeShape) -> list[StepScores]:
        """Draft and verify one tree per row; the rows' contexts end with their newest token."""
        B, N = len(self.rows), len(shape)
        draft_cache, target_cache = self._caches
        T = self._valid.shape[1]
        L = torch.tensor([len(r.context) for r in self.rows])  # context lengths
        anc = shape.ancestor_mask()
        depths = torch.tensor(shape.depths)
        last = torch.tensor([[r.context[-1]] for r in self.rows])
        valid_new = torch.cat([self._valid, torch.ones(B, 1, dtype=torch.bool)], dim=1)

        t0 = time.perf_counter()
        one = torch.ones(1, 1, dtype=torch.bool)
        logits = self._feed(self.draft, draft_cache, last, (L - 1)[:, None],
                            self._valid[:, None, :], one)
        fed: list[int] = []

        def expand(frontier: list[int], tokens: torch.Tensor) -> torch.Tensor:
            F = len(frontier)
            past = torch.cat([valid_new[:, None, :].expand(B, F, T + 1),
                              anc[frontier][:, fed][None].expand(B, F, len(fed))], dim=2)
            out = self._feed(self.draft, draft_cache, tokens[:, frontier],
                             _positions(L, depths[frontier] - 1), past, anc[frontier][:, frontier])
            fed.extend(frontier)
            return softmax(out, self.vocab)

        tokens, q, q_index = grow_tree(shape, softmax(logits[:, -1], self.vocab), expand)
        t1 = time.perf_counter()

        scored = [n for n in range(N) if shape.children[n]]
        S = len(scored)
        ids = torch.cat([last, tokens[:, scored].cpu()], dim=1)
        pos = torch.cat([(L - 1)[:, None], _positions(L, depths[scored] - 1)], dim=1)
        past = self._valid[:, None, :].expand(B, 1 + S, T)
        block = torch.zeros(1 + S, 1 + S, dtype=torch.bool)
        block[:, 0] = True  # the newest context token is seen by itself and every tree node
        block[1:, 1:] = anc[scored][:, scored]
        logits = self._feed(self.target, target_cache, ids, pos, past, block)
        p = torch.empty(B, N + 1, self.vocab, device=logits.device)
        p[:, [0] + [n + 1 for n in scored]] = softmax(logits, self.vocab)
        p[:, [n + 1 for n in range(N) if not shape.children[n]]] = float("nan")  # leaves
        t2 = time.perf_counter()

        for cache in self._caches:  # drop the tree entries: each row keeps its context
            crop(cache, T + 1)
        self._valid = valid_new
        share = 1 / B  # a batched pass's time is shared by its rows
        return [StepScores(tokens[b], q[b], q_index, p[b], (t1 - t0) * share, (t2 - t1) * share)
                for b in range(B)]


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: do not refuse


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.finfo(model.dtype).bits // 8


def check_batch_memory(pair, batch_size: int, tokens_per_row: int, tree_size: int) -> None:
    """Refuse a batch whose KV caches and logits would not fit in the memory free now, naming
    the largest batch size that would (checked before anything is measured or committed)."""
    from ..run.config import RunConfigError

    per_row = 0
    for m in (pair.draft, pair.target):
        per_row += kv_bytes_per_token(m.model) * (tokens_per_row + tree_size)
    per_row += 3 * (tree_size + 1) * pair.vocab_size * 4  # logits, softmax and p rows, float32
    free = _available_bytes(pair.target.device)
    budget = int(0.8 * free)
    if batch_size * per_row > budget:
        fits = max(budget // per_row, 0)
        raise RunConfigError(
            f"--batch-size {batch_size} needs about {batch_size * per_row / 2**30:.1f} GiB for "
            f"KV caches and logits, more than the {free / 2**30:.1f} GiB free on "
            f"{pair.target.device}; the largest batch that fits is about {fits}")

