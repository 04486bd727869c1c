"""Add the tokens of each assisted run's first step to a `specscope bench` record written before
the bench recorded them (``first_tokens``), so that its decode phase is read as the bench now
reads it: after the first step.

    python scripts/bench_first_steps.py BENCH.json [--int8] [--threads 2]

transformers' assisted generation verifies a chain drafted from the prompt in its first pass, and
every token it accepts there arrives with the first one; a record from before counted them as
decoded after it, in no time: the assisted method's runs, and routed's (and uniform's) where the
policy's entry is assisted generation. Greedy decoding is deterministic, so the first step is run
again on each prompt the record timed (the same prompts, rendered as the bench rendered them, the
same pair) and its tokens are checked against the recorded output's first tokens before they are
written. Nothing is timed: the recorded times stay as they are. Other methods' first steps are the
prefill's single token, which is what a record without the field is read as.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specscope.decode import make_decoder
from specscope.files import write_json
from specscope.prompts.render import render_item
from specscope.records import ALL_DOMAINS
from specscope.tune.bench import BenchConfig, BenchRun, bench_prompts, policy_setting
from specscope.tune.choose import PairRequest, load_decode_pair
from specscope.tune.hf_generate import hf_generate
from specscope.tune.policy import PolicyFile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path)
    parser.add_argument("--int8", action="store_true", help="the pair as the bench ran it")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    record = json.loads(args.bench.read_text())
    config = BenchConfig.from_dict(record["config"])
    if record.get("int8", False) != args.int8:
        parser.error(f"the bench ran with int8={record.get('int8')}: pass --int8 to match")
    runs = [BenchRun.from_dict(r) for r in record["runs"]]
    policy = PolicyFile.load(record["policy_file"])
    chains = [assisted_chain(r, policy, config) for r in runs]  # K, or None: not assisted
    todo = sorted({(r.prompt_id, k) for r, k in zip(runs, chains) if k is not None})
    if not todo:
        print(f"{args.bench}: no run of assisted generation on a fixed chain; nothing to add")
        return
    domains = list(dict.fromkeys(r.domain for r in runs))
    per_domain = max(sum(r.domain == d and r.method == "plain" for r in runs) for d in domains)
    router = record["router"]  # the learned router's bench splits the prompts: so is it drawn
    chosen = bench_prompts(domains, per_domain, 0, policy, router, split=router != "rules")
    items = {item.id: item for item in chosen.items}
    missing = sorted({p for p, _ in todo} - set(items))
    if missing:
        raise SystemExit(f"prompts not found again: {missing[:5]}")
    torch.set_num_threads(args.threads)
    pair = load_decode_pair(PairRequest(int8=args.int8))
    decoder = make_decoder(pair)  # the models the bench's decoders and generate() ran
    recorded = {(r.prompt_id, k): r.tokens for r, k in zip(runs, chains) if k is not None}
    first: dict[tuple[str, int], int] = {}
    for i, (prompt_id, k) in enumerate(todo):
        ids = render_item(
            pair.tokenizer, items[prompt_id], config.rendering, config.max_prompt_tokens
        ).ids
        g = hf_generate(decoder.target, ids, k + 2, decoder.eos, decoder.draft, k)
        if tuple(g.tokens[: g.first_tokens]) != recorded[prompt_id, k][: g.first_tokens]:
            raise SystemExit(f"{prompt_id}: the first step's tokens differ from the record's")
        first[prompt_id, k] = g.first_tokens
        print(f"[{i + 1}/{len(todo)}] {prompt_id}, K = {k}: first step {g.first_tokens} tokens")
    record["runs"] = [
        {**raw, "first_tokens": 1 if k is None else first[raw["prompt_id"], k]}
        for raw, k in zip(record["runs"], chains)
    ]
    write_json(args.bench, record)
    print(f"wrote {args.bench}: {len(first)} first steps of assisted generation")


def assisted_chain(run: BenchRun, policy: PolicyFile, config: BenchConfig) -> int | None:
    """K where ``run`` decoded with transformers' assisted generation on a chain of K: the
    assisted method's, or routed's and uniform's where the policy's entry says so (a routed
    prompt reused the assisted method's run, or ran its own entry's chain)."""
    if run.method == "assisted":
        return config.assisted_tokens
    if run.method not in ("routed", "uniform"):
        return None
    domain = run.routed_to if run.method == "routed" else ALL_DOMAINS
    setting = policy_setting(policy, domain)
    transformers = setting.backend == "transformers" and setting.tree is not None
    return len(setting.tree) if transformers else None


if __name__ == "__main__":
    main()
