"""Conclude a `specscope bench` record again, from its timed runs, against a policy file.

    python scripts/bench_conclude.py BENCH.json [--policy-file POLICY] [--with-candidates]

Reads every run the bench recorded (nothing is timed again) and prints what the bench prints:
the summary, predicted against measured for every cell, regret, routed against the best single
method and each interval's width against +-5%; --update writes what it concluded into BENCH.json:
the summary rows, predicted against measured, precision, regret and routed against the best
single method (the runs and everything else in it stay). --policy-file: the policy to set the
runs against (default: the one the bench ran). --with-candidates: a policy tuned before `tune` wrote its
`candidates` gets them computed from its own tuning runs and cost models (files written before the
bench: no bench data enters a prediction), so that every chain benched is predicted.
--with-routed: likewise for the routed cells, a policy tuned before `tune` wrote its `routed`
predictions (each domain's tuning prompts as the rule router sends them) gets them by tuning its
own runs again with its own cost models, refused unless that gives the file's choices; without
it, the routed predictions the record already holds (from such a run) are kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from specscope.analysis.bench_stats import BenchRun, speedup_precision, summarize_bench
from specscope.analysis.render import to_markdown
from specscope.files import json_text
from specscope.prompts.domains import select_prompts
from specscope.records import load_run
from specscope.tune import bench as checks
from specscope.tune.bench import BenchConfig
from specscope.tune.choose import drafter_of
from specscope.tune.costs import CostModel
from specscope.tune.policy import (
    Measured,
    PolicyFile,
    TuneConfig,
    chain_candidates,
    parse_backend,
    parse_drafter,
    tune,
)
from specscope.tune.predict import Prediction
from specscope.tune.routed import prompt_texts
from specscope.tune.study import bench_grid, decide


def measured_runs(policy: PolicyFile) -> list[Measured]:
    """The policy's tuning runs as ``tune`` weighed them: each run with the cost model of its
    drafter that the file holds, and its prompts' texts (for the routed prediction)."""
    source = policy.info.get("source") or {}
    models = policy.info.get("cost_models") or {"": policy.info["cost_model"]}
    run_dirs = dict.fromkeys(e.get("run_dir") for e in [source, *(source.get("runs") or ())])
    out = []
    for run_dir in filter(None, run_dirs):
        run = load_run(run_dir)
        drafter = drafter_of(run)
        costs = CostModel.from_dict(models.get(drafter.label) or next(iter(models.values())))
        out.append(Measured(drafter, run.nodes, run.steps, costs, prompt_texts(run.prompts)))
    return out


def with_routed(policy: PolicyFile) -> PolicyFile:
    """``policy`` with the routed predictions ``tune`` writes today: tuned again from its own
    runs and cost models (nothing the bench measured), refused unless that gives the file's
    choices."""
    again = tune(
        measured_runs(policy), TuneConfig(**policy.info.get("tune", {})), policy.info.get("source")
    )
    same = (again.trees, again.uniform, again.drafters, again.backends) == (
        policy.trees,
        policy.uniform,
        policy.drafters,
        policy.backends,
    )
    if not same or "routed" not in again.info:
        raise SystemExit(
            "tuning the policy's runs again does not give its choices (or no routed "
            "prediction): --with-routed cannot stand in for the file's tune"
        )
    return dataclasses.replace(policy, info={**policy.info, "routed": again.info["routed"]})


def with_candidates(policy: PolicyFile) -> PolicyFile:
    """``policy`` with the candidates ``tune`` writes today, from its tuning runs and the cost
    model of each drafter that the file holds."""
    config = TuneConfig(**policy.info.get("tune", {}))
    candidates = []
    for measured in measured_runs(policy):
        vectors = measured.vectors(config)
        candidates += chain_candidates(
            measured,
            measured.predictor(vectors),
            config,
            vectors,
            measured.assisted_predictor(vectors),
        )
    return dataclasses.replace(policy, info={**policy.info, "candidates": candidates})


def step_times(runs, policy: PolicyFile, config: BenchConfig) -> str:
    """Where a predicted speed-up misses, per method and domain: the step time the cost model
    predicted against the bench's (decode seconds over decoding steps after the first token),
    and plain's time per token in the cost model against the bench's plain (transformers'
    generate)."""
    model = policy.info.get("cost_model") or {}
    plain_model = model.get("plain_token_s")
    entries = {
        (
            c["domain"],
            c["tree"],
            parse_drafter(c, "candidates").resolved(),
            parse_backend(c, "candidates"),
        ): c["step_time_s"]
        for c in policy.info.get("candidates") or ()
    }
    settings = checks.method_settings(policy, config)
    lines = [
        "| method | domain | predicted step | measured step | measured / predicted "
        "| step / plain: predicted | measured |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]

    def plain_per_token(domain: str) -> float:
        mine = [r for r in runs if r.method == "plain" and r.domain == domain]
        return sum(r.decode_s for r in mine) / sum(r.decode_tokens for r in mine)

    domains = list(dict.fromkeys(r.domain for r in runs))
    plain_bench = {domain: plain_per_token(domain) for domain in domains}  # plain is every bench's
    for method in dict.fromkeys(r.method for r in runs):
        for domain in domains:
            mine = [r for r in runs if r.method == method and r.domain == domain]
            decode = sum(r.decode_s for r in mine)
            if method == "plain":
                measured, predicted = plain_bench[domain], plain_model
            elif method in settings and mine:
                drafter, tree, backend, stop = settings[method]
                key = (domain, tree.to_paths_literal(), drafter.resolved(), backend)
                measured = decode / max(1, sum(r.steps - 1 for r in mine))
                predicted = entries.get(key) if stop is None else None  # candidates: uncut
            else:
                continue
            ratio = f"{measured / predicted:.3f}" if predicted else "-"
            shown = f"{predicted * 1e3:.0f} ms" if predicted else "-"
            relative = "| - | -"
            if method != "plain" and predicted and plain_model:
                relative = f"| {predicted / plain_model:.3f} | {measured / plain_bench[domain]:.3f}"
            lines.append(
                f"| {method} | {domain} | {shown} | {measured * 1e3:.0f} ms | {ratio} {relative} |"
            )
    return (
        "### step times: the cost model against the bench\n\n"
        + "\n".join(lines)
        + "\n\nplain: seconds per token (cost model: "
        + {"transformers": "transformers' generate()", "specscope": "specscope's plain loop"}[
            model.get("plain_backend", "specscope")
        ]
        + " over the tuning runs' text; bench: transformers' generate()); a method: seconds per "
        "decoding step after the first token. step / plain: a step's time over plain decoding's "
        "token, the cost model's (what a predicted speed-up divides tokens per step by) and the "
        "bench's."
    )


def recorded_routed(record: dict) -> dict[str, checks.PolicyPrediction]:
    """The routed predictions a bench record already holds (set there by ``--with-routed`` when
    it was concluded: from the policy's own runs, before the bench), for a policy file without
    a ``routed`` table that today's ``tune`` no longer re-derives (its choices now weigh stop
    rules)."""
    out = {}
    for cell in record.get("predicted_vs_measured") or ():
        tokens = cell.get("predicted_tokens_per_step")
        if cell["method"] == "routed" and tokens:
            out[cell["domain"]] = checks.PolicyPrediction(
                Prediction.from_dict(tokens, "the bench record's routed prediction"),
                float(cell.get("predicted_speedup") or "nan"),
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path)
    parser.add_argument("--policy-file", type=Path)
    parser.add_argument("--with-candidates", action="store_true")
    parser.add_argument("--with-routed", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    parser.add_argument(
        "--update",
        action="store_true",
        help="write what it concluded (rows, predictions, precision, regret) into BENCH.json",
    )
    args = parser.parse_args()
    record = json.loads(args.bench.read_text())
    policy_path = args.policy_file or Path(record["policy_file"])
    policy = PolicyFile.load(policy_path)
    if args.with_candidates:
        policy = with_candidates(policy)
    if args.with_routed:
        policy = with_routed(policy)
    runs = [BenchRun.from_dict(r) for r in record["runs"]]
    config = BenchConfig.from_dict(record["config"])
    rows = summarize_bench(runs)
    predictions = checks.policy_predictions(policy_path)
    candidates = checks.candidate_predictions(policy, config)
    domains = list(dict.fromkeys(r.domain for r in runs))
    tuned = checks.tuning_prompts(policy)
    fitted = checks.tuning_per_domain(select_prompts(domains, None, seed=0), tuned)
    routed = checks.routed_predictions(policy, record.get("router", "rules"))
    routed = routed or recorded_routed(record)
    cells = checks.predicted_vs_measured(rows, runs, predictions, candidates, fitted, routed)
    precision = speedup_precision(runs)
    choices = checks.policy_choices(policy, config, domains)
    decision = decide(choices, domains, rows, runs, config.methods, derived=("routed",))
    grids = [
        bench_grid(rows, f"{record.get('machine', '')}: {args.bench}"),
        checks.prediction_grid(cells, tuned),
        checks.regret_grid(decision.regret, decision.unscored),
        checks.precision_grid(precision),
    ]
    text = "\n\n".join(to_markdown(g) for g in grids)
    if policy.info.get("candidates"):
        text += "\n\n" + step_times(runs, policy, config)
    if decision.routed_vs_best_single is not None:
        text += "\n\n" + decision.routed_vs_best_single.sentence
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.update:
        record["rows"] = [dataclasses.asdict(r) for r in rows]
        record.update(checks.conclusions_document(cells, precision))
        record.update(decision.to_dict())
        args.bench.write_text(json_text(record))


if __name__ == "__main__":
    main()
