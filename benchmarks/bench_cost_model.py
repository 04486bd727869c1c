"""tune's step-time model against real steps: predicted and measured step time over plain decoding.

    python benchmarks/bench_cost_model.py [--int8] [--per-domain 3] [--chain 3] [--rounds 2]

A predicted speed-up is tokens per step over (step time / plain time per token); this checks the
second factor, the one the cost model supplies, on the bench's prompts. It loads the demo pair
once and, in each round, times two cost models (``measure_costs``, the drafter a draft model):
as ``tune`` times it (real text from the shipped study, at the median context of its steps,
decodes as long as the bench's) and as it used to (random tokens, 256 of them, 16-token
decodes), then decodes the held-out prompts of the shipped int8 policy, each
one with transformers' plain ``generate()``, specscope's decoder drafting a chain of K, and
transformers' assisted generation drafting K, all greedy, ``--max-new-tokens`` each. A decode's
step time is its time after the first step over its steps after the first (plain: per token).
Prints per domain the measured step / plain of each backend, and each cost model's prediction of
it with the relative error.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from specscope.decode import DecodeConfig, make_decoder
from specscope.models import PairConfig, load_pair
from specscope.prompts.render import render_item
from specscope.trees import TreeShape
from specscope.tune.bench import bench_prompts
from specscope.tune.choose import load_tune_runs
from specscope.tune.costs import COST_DECODE_TOKENS, measure_costs
from specscope.tune.hf_generate import hf_generate
from specscope.tune.policy import PolicyFile

POLICY = Path("results/demo-pair/drafters/decisions/policy.json")  # tuned on the study
STUDY = Path("results/demo-pair/drafters/draft-model")
DOMAINS = ("code", "math", "reasoning", "chat")


def measured_ratios(pair, decoder, items, k: int, max_new_tokens: int) -> dict[str, list]:
    """Per domain, (specscope step / plain token, assisted step / plain token) per prompt."""
    chain = TreeShape.from_paths([(0,) * d for d in range(1, k + 1)])
    out: dict[str, list] = {}
    for item in items:
        ids = render_item(pair.tokenizer, item, "task", 512).ids
        eos = decoder.eos
        g = hf_generate(pair.target.model, ids, max_new_tokens, eos, min_new_tokens=2)
        plain = (g.time_s - g.first_token_s) / (len(g.tokens) - g.first_tokens)
        r = decoder.generate(ids, chain, DecodeConfig(max_new_tokens=max_new_tokens))
        mine = (r.time_s - r.steps[0].step_time_s) / max(1, len(r.steps) - 1)  # after the prefill
        a = hf_generate(pair.target.model, ids, max_new_tokens, eos, pair.draft.model, k)
        theirs = (a.time_s - a.first_token_s) / max(1, a.target_passes - 1)  # after the first
        out.setdefault(item.domain, []).append((mine / plain, theirs / plain))
        print(
            f"  {item.id} ({len(ids)} tokens): specscope {mine / plain:.3f} "
            f"({len(r.steps) - 1} steps), assisted {theirs / plain:.3f} "
            f"({a.target_passes - 1} steps), plain {1000 * plain:.1f} ms",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--int8", action="store_true", help="the int8 pair (else bfloat16)")
    parser.add_argument("--per-domain", type=int, default=3)
    parser.add_argument("--chain", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    torch.set_num_threads(2)

    config = (
        PairConfig(quantize="int8", dtype="float32") if args.int8 else PairConfig(dtype="bfloat16")
    )
    pair = load_pair(config)
    decoder = make_decoder(pair)
    chain = TreeShape.from_paths([(0,) * d for d in range(1, args.chain + 1)])
    study = load_tune_runs([STUDY])
    median_context = study.decoding_context
    contexts = {  # label -> context length, its tokens (None: random), tokens per timed decode
        f"real text, {median_context} tokens": (
            median_context,
            study.timing_text(pair.tokenizer, median_context),
            args.max_new_tokens,
        ),
        "random tokens, 256": (256, None, COST_DECODE_TOKENS),
    }
    policy = PolicyFile.load(POLICY)
    items = bench_prompts(list(DOMAINS), args.per_domain, 0, policy, split=False).items
    predicted: dict[int, list] = {}
    measured: dict[str, list] = {}
    for rnd in range(args.rounds):
        for label, (context, text, tokens) in contexts.items():
            costs = measure_costs(decoder, context_len=context, text=text, decode_tokens=tokens)
            mine = costs.step_time(chain) / costs.plain_token_s
            theirs = costs.assisted_step_time(args.chain) / costs.plain_token_s
            predicted.setdefault(label, []).append((mine, theirs))
            print(
                f"round {rnd + 1}, cost model on {label}: plain "
                f"{1000 * costs.plain_token_s:.1f} ms, specscope step {mine:.3f}, assisted "
                f"{theirs:.3f} (step_scale {costs.step_scale:.3f})",
                flush=True,
            )
        for domain, ratios in measured_ratios(
            pair, decoder, items, args.chain, args.max_new_tokens
        ).items():
            measured.setdefault(domain, []).extend(ratios)

    print(f"\nstep time / plain time per token, chain of {args.chain} (median over prompts)")
    header = "| domain | backend | measured | " + " | ".join(
        f"predicted, {label} (error)" for label in predicted
    )
    print(header + " |")
    print("|---|---|---:|" + "---:|" * len(predicted))
    rows = {**measured, "all": [x for v in measured.values() for x in v]}
    for domain, ratios in rows.items():
        for i, backend in enumerate(("specscope", "assisted")):
            real = statistics.median(r[i] for r in ratios)
            cells = []
            for values in predicted.values():
                guess = statistics.median(v[i] for v in values)
                cells.append(f"{guess:.3f} ({100 * (guess / real - 1):+.1f}%)")
            print(f"| {domain} | {backend} | {real:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
