"""The paper's algorithm, every draft and target row recomputed from scratch (``use_cache=False``).

The independent oracle that proves the records of batched measurement (the tests compare them),
and ``specscope run --measure-engine naive``. Slow by design: it runs its own forwards, without a cache,
and shares nothing with the speculation stages but :func:`~specscope.core.draft.grow_tree` (which
node takes which token). The measurement driver commits its steps like any other
(:func:`specscope.measure.study.commit_greedy_token`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..core.batch import StepScores
from ..core.draft import grow_tree
from ..core.passes import softmax
from ..drafters import Lookup
from ..trees import TreeShape


@dataclass
class NaiveOracle:
    """Scores one prompt's tree the paper's way: every row a forward over the whole sequence."""

    draft: torch.nn.Module | None
    target: torch.nn.Module
    vocab: int
    lookup: Lookup | None = None  # a model-free drafter (draft None)

    @staticmethod
    def _rows(model, rows: list[list[int]]) -> torch.Tensor:
        """Right-padded batch forward; causal attention keeps padding out of real positions."""
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            attn[i, : len(r)] = 1
        return model(
            input_ids=ids.to(model.device), attention_mask=attn.to(model.device), use_cache=False
        ).logits

    @torch.inference_mode()
    def score(self, context: list[int], shape: TreeShape) -> StepScores:
        L, N = len(context), len(shape)
        t0 = time.perf_counter()

        def path(n: int, tokens: torch.Tensor) -> list[int]:
            out = []
            while n >= 0:
                out.append(int(tokens[n]))
                n = shape.parents[n]
            return out[::-1]

        def expand(frontier: list[int], tokens: torch.Tensor) -> torch.Tensor:
            logits = self._rows(self.draft, [context + path(n, tokens[0]) for n in frontier])
            return softmax(logits[:, L + shape.depths[frontier[0]] - 1], self.vocab)[None]

        if self.lookup is not None:
            chain = self.lookup(context, N)
            tokens = torch.zeros(N, dtype=torch.long)
            tokens[: len(chain)] = torch.tensor(chain, dtype=torch.long)
            q, q_index, proposed = None, torch.arange(N), len(chain)
        else:
            root = self._rows(self.draft, [context])[0, -1:]
            tokens, q, q_index = grow_tree(shape, softmax(root, self.vocab), expand)
            tokens, q, proposed = tokens[0], q[0], N
        t1 = time.perf_counter()

        # One batch: the context alone, then the context extended by each root-to-leaf path.
        leaf_paths = shape.leaf_paths()
        logits = self._rows(
            self.target, [context] + [context + path(leaf[-1], tokens) for leaf in leaf_paths]
        )
        p_rows = torch.empty(N + 1, logits.shape[-1], device=logits.device)
        p_rows[0] = logits[0, L - 1]
        for row, leaf in enumerate(leaf_paths, start=1):
            for n in leaf:
                p_rows[n + 1] = logits[row, L - 1 + shape.depths[n]]
        p = softmax(p_rows, self.vocab)
        t2 = time.perf_counter()
        return StepScores(tokens, q, q_index, p, t1 - t0, t2 - t1, proposed).on(p.device)
