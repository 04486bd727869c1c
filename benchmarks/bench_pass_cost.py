"""What a forward pass of k tokens costs, relative to one token, for each way of running the target.

    python benchmarks/bench_pass_cost.py [--role target] [--modes bfloat16,float32,int8] [--threads 2]

Speculation pays when verifying k drafted tokens costs little more than decoding one. On a GPU a
pass of a few tokens is memory-bound and costs about one token's pass; on a small CPU it may not
be. This times one forward of k tokens over a 256-token cache (median of --repeats) for the demo
pair's target (or draft) loaded in each mode, with the code the decoder uses (``feed`` with a 4D
mask; int8 = ``PairConfig(quantize="int8")``: int8 linears and row-wise attention), and prints
milliseconds and the ratio to k = 1. The modes are measured one after the other in one process.
"""

from __future__ import annotations

import argparse

import torch

from specscope.core.passes import forward, new_cache
from specscope.models import PairConfig, load_pair
from specscope.tune.costs import time_forward

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=("target", "draft"), default="target")
    parser.add_argument("--modes", default="bfloat16,float32,int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"demo {args.role}, one forward of k tokens over a {args.context}-token cache, "
        f"median of {args.repeats}, {args.threads} threads: ms (ratio to k = 1)"
    )
    print(f"{'mode':9s}" + "".join(f"{k:>15d}" for k in SIZES))
    for mode in args.modes.split(","):
        config = (
            PairConfig(dtype="float32", quantize="int8")
            if mode == "int8"
            else PairConfig(dtype=mode)
        )
        pair = load_pair(config)
        model = getattr(pair, args.role).model
        with torch.inference_mode():
            cache = new_cache(model)
            forward(
                model, cache, input_ids=torch.randint(0, 1000, (1, args.context)), logits_to_keep=1
            )
            vocab = model.config.vocab_size
            time_forward(model, cache, args.context, 1, 2, vocab)  # warm-up
            ms = [
                1000 * time_forward(model, cache, args.context, k, args.repeats, vocab)
                for k in SIZES
            ]
        print(f"{mode:9s}" + "".join(f"{t:9.0f} ({t / ms[0]:3.1f})" for t in ms), flush=True)
        del pair, model, cache


if __name__ == "__main__":
    main()
