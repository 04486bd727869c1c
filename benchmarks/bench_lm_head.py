"""The LM head in bfloat16: transformers' sliced input against a row-major one, side by side.

    python benchmarks/bench_lm_head.py [--per-domain 2] [--max-new-tokens 16] [--rounds 3]

transformers computes the logits it keeps from a slice of the hidden states; given that slice in
bfloat16 on the CPU, torch 2.13's matmul copies the head's whole weight on every call.
``load_model`` gives the head a row-major input instead (``_row_major_input``). This loads the
demo pair once in bfloat16 and times, with that hook and without it, in alternating order per
round: batched measurement (``run_study``, batch 8, paper tree), speculative decoding (a chain of 3
drafted by the draft model, one prompt at a time) and the target's plain ``generate()`` (the
bench's plain baseline), on the same offline prompts. It
prints each cell's median seconds, the ratio within each round, and whether the two heads give
the same records and the same decoded tokens (they must: the product is the same).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from specscope.decode import DecodeConfig, make_decoder
from specscope.models import PairConfig, load_pair
from specscope.models.load import _row_major_input
from specscope.prompts.render import render_item
from specscope.records import load_run
from specscope.run.config import PromptSpec, RunConfig
from specscope.run.study import run_study
from specscope.trees import TreeConfig, TreeShape


def toggle_row_major(models, on: bool) -> None:
    """Add or remove the row-major hook on each model's head (a benchmark may reach inside)."""
    for model in models:
        hooks = model.get_output_embeddings()._forward_pre_hooks
        for key in [k for k, f in hooks.items() if f is _row_major_input]:
            del hooks[key]
        if on:
            model.get_output_embeddings().register_forward_pre_hook(_row_major_input)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-domain", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    config = RunConfig(
        pair=PairConfig(dtype="bfloat16"),
        tree=TreeConfig(policy="paper"),
        prompts=PromptSpec(
            domains=("code", "math", "reasoning", "chat"), per_domain=args.per_domain
        ),
        max_new_tokens=args.max_new_tokens,
    )
    items = config.prompts.select(config.seed)
    pair = load_pair(config.pair)
    models = [pair.draft.model, pair.target.model]
    prompts = [render_item(pair.tokenizer, item, "task", 512).ids for item in items]
    decoder = make_decoder(pair)
    decode_config = DecodeConfig(max_new_tokens=args.max_new_tokens)

    def measure(out: Path) -> tuple[float, object]:
        t0 = time.perf_counter()
        run_study(config, out, progress=False, pair=pair, batch_size=8)
        return time.perf_counter() - t0, load_run(out).nodes

    def decode(_out: Path) -> tuple[float, object]:
        t0 = time.perf_counter()
        tokens = [decoder.generate(p, TreeShape.chain(3), decode_config).tokens for p in prompts]
        return time.perf_counter() - t0, tokens

    def generate(_out: Path) -> tuple[float, object]:
        t0 = time.perf_counter()
        tokens = [
            pair.target.model.generate(
                torch.tensor([p]), max_new_tokens=args.max_new_tokens, do_sample=False
            )[0, len(p) :].tolist()
            for p in prompts
        ]
        return time.perf_counter() - t0, tokens

    work = {
        "measure (batch 8)": measure,
        "decode (chain 3)": decode,
        "plain generate()": generate,
    }
    heads = ["sliced (as transformers gives it)", "row-major"]
    seconds = {(w, h): [] for w in work for h in heads}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = heads if round_ % 2 == 0 else heads[::-1]
            for name, job in work.items():
                for head in order:
                    toggle_row_major(models, head == "row-major")
                    wall, result = job(Path(tmp) / f"{round_}-{len(results)}-{head[:3]}")
                    seconds[name, head].append(wall)
                    results.setdefault((name, head), result)
                    print(f"round {round_ + 1}: {name:18} {head:34} {wall:7.1f} s", flush=True)
    toggle_row_major(models, True)
    print("\n| work | sliced head (s) | row-major head (s) | speed-up [min, max] | same output |")
    print("|---|---:|---:|---:|---|")
    for name in work:
        slow, fast = (seconds[name, h] for h in heads)
        ratios = [s / f for s, f in zip(slow, fast)]
        a, b = (results[name, h] for h in heads)
        same = a.equals(b) if hasattr(a, "equals") else a == b
        print(
            f"| {name} | {statistics.median(slow):.1f} | {statistics.median(fast):.1f} "
            f"| {statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}] "
            f"| {'yes' if same else 'NO'} |"
        )


if __name__ == "__main__":
    main()
