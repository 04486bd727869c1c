"""A bench on the tuning prompts set beside the replay of the very prompts it timed.

    specscope bench --policy-file POLICY --tuning-prompts ... -o BENCH.json
    python scripts/same_prompts.py BENCH.json [--out same-prompts.md]

For every method the bench timed with a fixed drafter and tree (``chain``, ``ngram``,
``uniform``), the tuning run of its drafter (one of the policy's runs) is replayed as greedy
decoding with that tree on exactly the prompts the bench timed, steps counted as the decoder counts
them (the prefill a plain step). Prints, per method and domain: tokens per step replayed and
decoded, their difference, the prompts whose step counts are equal, and the prompts whose output
equals the run's recorded one. Decoding equals the replay where the output equals the recorded
one: a difference in steps is then a defect, not noise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from specscope.analysis.replay import (
    ReplayRecords,
    StopRule,
    Subtree,
    replay_counts,
    shape_label,
)
from specscope.trees import TreeShape
from specscope.tune.bench import BenchConfig, RecordedOutputs, method_settings, policy_runs
from specscope.tune.choose import drafter_of
from specscope.tune.policy import PolicyFile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="a bench JSON written with --tuning-prompts")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args()
    bench = json.loads(args.bench.read_text())
    policy = PolicyFile.load(bench["policy_file"])
    config = BenchConfig.from_dict(bench["config"])
    settings = method_settings(policy, config)
    runs = policy_runs(policy)
    recorded = RecordedOutputs.of(runs)
    if config.max_new_tokens != recorded.max_new_tokens:
        raise SystemExit(
            f"the bench decoded {config.max_new_tokens} tokens per prompt and the runs "
            f"recorded {recorded.max_new_tokens}: bench again with --max-new-tokens "
            f"{recorded.max_new_tokens} to replay the same outputs"
        )
    by_drafter = {drafter_of(r).resolved(): r for r in runs}
    lines = [
        "| method | domain | prompts | replayed tokens/step | decoded | difference | "
        "steps equal | output = run's |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method, (drafter, tree, backend, stop) in settings.items():
        run = by_drafter.get(drafter.resolved())
        if run is None or not isinstance(tree, TreeShape):
            print(f"{method}: no tuning run of {drafter.label} among the policy's runs; skipped")
            continue
        timed = {r["prompt_id"]: r for r in bench["runs"] if r["method"] == method}
        keep = run.steps["prompt_id"].isin(timed)
        records = ReplayRecords.from_frames(
            run.nodes[run.nodes["prompt_id"].isin(timed)], run.steps[keep]
        )
        if not records.holds(tree):
            print(
                f"{method}: {shape_label(tree)} is deeper or wider than the run measured; skipped"
            )
            continue
        cut = StopRule(Subtree(tree), **stop.decode_args) if stop else Subtree(tree)
        counts = replay_counts(records, cut, prefill_drafts=backend == "transformers")
        replayed = dict(zip(records.prompt_ids, zip(counts.positions, counts.steps)))
        for domain in dict.fromkeys(r["domain"] for r in timed.values()):
            ids = [p for p, r in timed.items() if r["domain"] == domain and p in replayed]
            rep = np.array([replayed[p] for p in ids], float)
            dec = np.array([(len(timed[p]["tokens"]), timed[p]["steps"]) for p in ids], float)
            same_output = sum(
                tuple(timed[p]["tokens"][: recorded.max_new_tokens]) == recorded.outputs.get(p)
                for p in ids
            )
            steps_equal = int((rep[:, 1] == dec[:, 1]).sum())
            r_tau, d_tau = rep[:, 0].sum() / rep[:, 1].sum(), dec[:, 0].sum() / dec[:, 1].sum()
            lines.append(
                f"| {method} ({drafter.label} {shape_label(tree)}) | {domain} | {len(ids)} | "
                f"{r_tau:.3f} | {d_tau:.3f} | {d_tau / r_tau - 1:+.1%} | {steps_equal} | "
                f"{same_output} |"
            )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
