"""What the int8 draft's passes cost on row-wise attention (batch-invariant) against SDPA.

    python benchmarks/bench_draft_attention.py [--rounds 5] [--context 118]

Measurement runs the int8 draft on row-wise attention, so that its top tokens do not depend on
the batch; decoding keeps it on SDPA. This prints the price of decoding on row-wise attention
too: the draft's passes of 1, 2 and 4 tokens over a cached context (the sizes a chain's steps
feed it) and its prefill, each attention timed in turn within every round, medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specscope.core.passes import prefill
from specscope.models import PairConfig, load_pair
from specscope.models.int8 import ROWWISE_ATTENTION
from specscope.tune.costs import time_forward

SIZES = (1, 2, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--context", type=int, default=118, help="cached tokens (tune's median)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    pair = load_pair(PairConfig(quantize="int8", dtype="float32"))
    draft = pair.draft.model
    context = list(range(1000, 1000 + args.context))
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for attention in (ROWWISE_ATTENTION, "sdpa"):
            draft.set_attn_implementation(attention)
            t0 = time.perf_counter()
            cache = prefill(draft, context)[0]
            times.setdefault((attention, "prefill"), []).append(time.perf_counter() - t0)
            for k in SIZES:
                runs = [
                    time_forward(draft, cache, len(context), k, 1, pair.vocab_size)
                    for _ in range(5)
                ]
                times.setdefault((attention, f"{k} tokens"), []).append(statistics.median(runs))
    print(f"int8 draft, {args.context} cached tokens, 2 threads, {args.rounds} rounds")
    print("| pass | row-wise ms | SDPA ms | row-wise / SDPA |")
    print("|---|---:|---:|---:|")
    for what in [f"{k} tokens" for k in SIZES] + ["prefill"]:
        rowwise = statistics.median(times[ROWWISE_ATTENTION, what])
        sdpa = statistics.median(times["sdpa", what])
        print(f"| {what} | {1000 * rowwise:.1f} | {1000 * sdpa:.1f} | {rowwise / sdpa:.2f} |")


if __name__ == "__main__":
    main()
