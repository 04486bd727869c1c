"""The speculation core before and after a restructuring: the same work timed on either checkout.

    python benchmarks/bench_refactor.py measure1|measure4|decode

measure1/measure4: the paper protocol on 2 smoke prompts x 12 tokens (float32, paper tree) with
batch size 1 or 4; decode: greedy speculative decoding of 2 prompts x 24 tokens with a depth-4
chain and the paper tree. Prints the seconds of the timed part (model loading excluded). Runs
against this checkout, or against one from before the speculation core (commit 700cee5) with
``PYTHONPATH=OLD_CHECKOUT/src``; alternate the two to compare (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import time

import torch

from specscope.models import PairConfig, load_pair
from specscope.trees import TreeConfig

try:
    from specscope.decode import DecodeConfig, make_decoder
    from specscope.measure.study import measure_prompts, start_prompts
    from specscope.run.config import PromptSpec, RunConfig
    from specscope.tune.policy import make_speculation
    CHECKOUT = "core"
except ImportError:  # a checkout from before the speculation core (700cee5)
    from specscope.decoding import DecodeConfig, make_decoder
    from specscope.engine import make_engine
    from specscope.policies import make_speculation
    from specscope.runner import PromptSpec, RunConfig, measure_batched, measure_prompt
    CHECKOUT = "before"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", choices=("measure1", "measure4", "decode"))
    work = parser.parse_args().work
    torch.manual_seed(0)
    config = RunConfig(pair=PairConfig(dtype="float32"), tree=TreeConfig(policy="paper"),
                       prompts=PromptSpec(smoke=True), max_new_tokens=12)
    pair = load_pair(config.pair)
    items = config.prompts.select(config.seed)[:2]
    todo = list(enumerate(items))
    units = []
    t0 = time.perf_counter()
    if work.startswith("measure"):
        batch = int(work[-1])

        def commit(order, item, records) -> None:
            units.append(records.nodes.num_rows)

        if CHECKOUT == "core":
            measure_prompts(pair, config, start_prompts(pair, config, todo), "bench", commit,
                            batch_size=batch)
        elif batch == 1:
            engine = make_engine("cached", pair.draft.model, pair.target.model, pair.vocab_size)
            for order, item in todo:
                commit(order, item, measure_prompt(engine, pair, item, config,
                                                   config.tree.shape(), order, "bench"))
        else:
            measure_batched(pair, todo, config, config.tree.shape(), "bench", batch,
                            lambda state, records: commit(state.order, state.item, records))
    else:
        decoder = make_decoder(pair)
        for spec in (make_speculation("chain", depth=4), make_speculation("paper")):
            for item in items:
                text = pair.tokenizer.apply_chat_template(list(item.messages), tokenize=False,
                                                          add_generation_prompt=True)
                ids = pair.tokenizer(text, add_special_tokens=False)["input_ids"]
                units.append(len(decoder.generate(ids, spec, DecodeConfig(max_new_tokens=24)).tokens))
    print(f"{work} ({CHECKOUT}): {sum(units)} {'nodes' if work != 'decode' else 'tokens'} "
          f"in {time.perf_counter() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    main()
