"""Cached vs naive engine on the demo pair: nodes per second and the cached engine's overhead.

    python benchmarks/bench_engines.py [--max-new-tokens 32] [--naive-max-new-tokens 4]

Runs the paper protocol (paper tree, chat template) with both engines on the same prompts, one per
domain from the offline sources, side by side in one process (the naive engine for fewer steps:
each of its steps recomputes every row from scratch), and prints nodes per second of each,
their ratio, and for the cached engine the share of step time spent outside the model forward
passes it cannot avoid (D batched draft passes and one target tree pass per step).
"""

from __future__ import annotations

import argparse
import time

import torch

from specscope.core.batch import Batch
from specscope.measure.study import measure_prompts, start_prompts
from specscope.models import PairConfig, load_pair
from specscope.run.config import PromptSpec, RunConfig
from specscope.trees import TreeConfig


class ForwardTimer:
    """Adds up wall time spent inside the models' forward calls made during tree steps."""

    def __init__(self, *modules: torch.nn.Module):
        self.seconds, self.calls, self.enabled, self._t0 = 0.0, 0, True, 0.0
        for m in modules:
            m.register_forward_pre_hook(self._start)
            m.register_forward_hook(self._stop)

    def _start(self, *_):
        self._t0 = time.perf_counter()

    def _stop(self, *_):
        if self.enabled:
            self.seconds += time.perf_counter() - self._t0
            self.calls += 1

    def paused(self, fn):
        """Wrap ``fn`` (the loop's prefill) so that its forward calls are not counted."""

        def wrapper(*args, **kwargs):
            self.enabled = False
            try:
                return fn(*args, **kwargs)
            finally:
                self.enabled = True

        return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--naive-max-new-tokens",
        type=int,
        default=4,
        help="steps per prompt for the naive engine, which recomputes everything",
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--domains", default="code,math,reasoning,chat")
    args = parser.parse_args()

    config = RunConfig(
        pair=PairConfig(dtype=args.dtype),
        tree=TreeConfig(policy="paper"),
        prompts=PromptSpec(domains=tuple(args.domains.split(",")), per_domain=1),
        max_new_tokens=args.max_new_tokens,
    )
    items = config.prompts.select(config.seed)
    pair = load_pair(config.pair)
    timer = ForwardTimer(pair.draft.model, pair.target.model)
    Batch.refill = timer.paused(Batch.refill)
    rates = {}
    for name in ("cached", "naive"):
        if name == "naive":
            config = config.replace(max_new_tokens=args.naive_max_new_tokens)
        timer.seconds, timer.calls = 0.0, 0
        nodes = steps = 0
        step_time = 0.0
        t0 = time.perf_counter()
        config = config.replace(engine=name)
        records = []
        measure_prompts(
            pair,
            config,
            start_prompts(pair, config, list(enumerate(items))),
            "bench",
            lambda order, item, r, out=records: out.append(r),
            batch_size=1,
        )
        for r in records:
            nodes += r.nodes.num_rows
            steps += r.steps.num_rows
            step_time += sum(r.steps.column("step_time_s").to_pylist())
        wall = time.perf_counter() - t0
        rates[name] = nodes / wall
        print(
            f"{name:>6}: {nodes} nodes, {steps} steps in {wall:.1f} s = {rates[name]:.2f} nodes/s; "
            f"{timer.calls / steps:.1f} forward calls per step"
        )
        if name == "cached":
            outside = step_time - timer.seconds
            print(
                f"        step time {step_time:.1f} s, of which {timer.seconds:.1f} s in the "
                f"forward passes and {outside:.2f} s outside them "
                f"({100 * outside / step_time:.1f}% overhead)"
            )
    print(f"speed-up cached/naive: {rates['cached'] / rates['naive']:.1f}x nodes per second")


if __name__ == "__main__":
    main()
