"""tune/bench: the bench refuses (or labels in-sample) the prompts the policy was tuned on, sets
the policy file's predictions beside what it measures for every cell, and says whether each
domain's speed-up interval is ±5% or narrower, or what it would take; on a tiny pair."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from specscope.analysis.bench_stats import least_ratio, speedup_precision, summarize_bench
from specscope.analysis.render import to_markdown
from specscope.analysis.stats import Estimate, none_differed_p
from specscope.decode import SpeculativeDecoder
from specscope.files import json_text
from specscope.models.tiny import near_pair
from specscope.prompts.domains import select_prompts
from specscope.records import ALL_DOMAINS
from specscope.trees import TreeShape
from specscope.tune.bench import (
    BenchConfig,
    BenchError,
    BenchRun,
    HeldOut,
    PolicyPrediction,
    PredictedCell,
    bench_decoder,
    bench_prompts,
    check_held_out,
    checks_document,
    differing_prompts,
    policy_predictions,
    precision_grid,
    predicted_vs_measured,
    prediction_grid,
    regret_grid,
    tuning_prompts,
)
from specscope.tune.policy import Choice, PolicyFile
from specscope.tune.predict import EXTRAPOLATED, TIMED, Prediction
from specscope.tune.router import RuleRouter

CODE_IDS = [it.id for it in select_prompts(["code"], None, seed=42)]


def _policy(source: dict | None = None, predictions: bool = True) -> PolicyFile:
    """code: a chain of 2 predicted at 2.5 [2.3, 2.7] tokens per step (replay) and 1.3x; the
    uniform chain of 1 predicted at 1.6 (extrapolated) and 1.1x."""
    code = Choice(TreeShape.chain(2), 1.3, 0.1, prediction=Prediction(2.5, 2.3, 2.7))
    uniform = Choice(TreeShape.chain(1), 1.1, 0.08, prediction=Prediction(1.6, method=EXTRAPOLATED))
    return PolicyFile(
        trees={"code": code.shape},
        uniform=uniform.shape,
        choices={"code": code, ALL_DOMAINS: uniform} if predictions else {},
        info={"source": source} if source is not None else {},
    )


# --- which prompts a tuning run measured --------------------------------------------------------


def test_tuning_prompts_gather_every_runs_prompts(tmp_path):
    run_dir = tmp_path / "ngram-run"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"prompts": {"ids": ["c", "d"]}}))
    source = {
        "run_id": "r1",
        "prompt_ids": ["a", "b"],
        "runs": [
            {"run_id": "r1", "run_dir": "x"},
            {"run_id": "r2", "prompt_ids": ["e"]},
            {"run_id": "r3", "run_dir": str(run_dir)},  # no ids in the file: the manifest's
        ],
    }
    tuned = tuning_prompts(_policy(source))
    assert tuned.ids == {"a", "b", "c", "d", "e"} and tuned.runs == ("r1", "r2", "r3")
    assert tuned.known
    untraced = {**source, "runs": [{"run_id": "r9", "run_dir": str(tmp_path / "gone")}]}
    with pytest.raises(BenchError, match="run r9.*cannot tell its prompts from held-out"):
        tuning_prompts(_policy(untraced))
    assert not tuning_prompts(_policy()).known and not tuning_prompts(None).ids


def test_the_bench_never_times_a_tuning_prompt_unless_labelled_in_sample():
    tuned_ids = CODE_IDS[:150]  # leaves 14 held out, 7 after the router's half
    policy = _policy({"run_id": "r1", "prompt_ids": tuned_ids})
    chosen = bench_prompts(["code"], 5, 42, policy)
    assert len(chosen.items) == 5 and not chosen.in_sample_ids
    assert not {it.id for it in chosen.items} & set(tuned_ids)
    with pytest.raises(BenchError, match="'code' has 7 held-out prompts.*fewer than the 20"):
        bench_prompts(["code"], 20, 42, policy)
    labelled = bench_prompts(["code"], 20, 42, policy, in_sample=True)
    assert labelled.in_sample_ids and labelled.in_sample_ids <= set(tuned_ids)
    with pytest.raises(BenchError, match="measured by the policy's tuning runs \\(r1\\)"):
        check_held_out(labelled.items, labelled.tuned, in_sample=False)
    check_held_out(labelled.items, labelled.tuned, in_sample=True)


@pytest.mark.parametrize(
    "predicted, measured, inside",
    [
        (Prediction(2.5, 2.3, 2.7, prompts=30), 2.8, True),  # widened to [2.18, 2.82]
        (Prediction(2.5, 2.3, 2.7, prompts=30), 2.9, False),
        (Prediction(1.0, 1.0, 1.0, TIMED, prompts=10), 1.0, True),  # no spread, and none here
        (Prediction(1.0, 1.0, 1.0, TIMED, prompts=10), 1.007, None),  # nothing bounds it
        (Prediction(2.5, method=EXTRAPOLATED), 2.5, None),  # no interval
    ],
)
def test_a_held_out_cell_is_inside_the_interval_for_its_prompts(predicted, measured, inside):
    cell = PredictedCell(
        "chain", "code", 20, 0, PolicyPrediction(predicted, 1.2), measured, 1.2, 1.1, 1.3
    )
    assert cell.tokens_inside is inside


@pytest.mark.parametrize(
    "differing, inside", [(0, True), (1, True), (4, True), (5, False), (9, False)]
)
def test_a_prediction_of_no_width_is_checked_by_the_prompts_that_decode_otherwise(
    differing, inside
):
    # every one of 20 tuning prompts decoded 1.00 tokens per step (a lookup whose drafts nobody
    # accepted); of 20 held-out prompts, `differing` decoded more. One population leaves all the
    # differing prompts among the held-out ones with chance C(20, k) / C(40, k): 0.053 at 4,
    # 0.024 at 5 (Fisher's exact test, one-sided)
    assert none_differed_p(20, 20, 4) == pytest.approx(4845 / 91390)
    assert none_differed_p(20, 20, 5) == pytest.approx(15504 / 658008)
    assert none_differed_p(20, 20, 0) == 1.0
    flat = PolicyPrediction(Prediction(1.0, 1.0, 1.0, TIMED, prompts=20), 1.07)
    runs = [
        BenchRun("ngram-mod", f"r{i}", "reasoning", "", tuple(range(64)), 60 if i < differing else 64, 1.0, 0.1)
        for i in range(20)
    ]  # fmt: skip
    assert differing_prompts(flat, runs) == differing
    assert (
        differing_prompts(PolicyPrediction(Prediction(2.5, 2.3, 2.7, prompts=30), 1.2), runs)
        is None
    )
    tau = sum(len(r.tokens) for r in runs) / sum(r.steps for r in runs)
    cell = PredictedCell(
        "ngram-mod", "reasoning", 20, 0, flat, tau, 1.1, 1.0, 1.2, differing=differing
    )
    assert cell.tokens_inside is inside


# --- predicted against measured, on a tiny pair ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bench(tokenizer):
    torch.set_num_threads(1)
    draft, target = near_pair("qwen2", len(tokenizer), noise=0.05)
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    policy = _policy({"run_id": "r1", "prompt_ids": CODE_IDS[:120]})
    chosen = bench_prompts(["code"], 3, 42, policy, in_sample=True)
    config = BenchConfig(
        max_new_tokens=8, warmup=0, repeats=2, methods=("plain", "chain", "uniform", "routed")
    )
    runs = bench_decoder(
        lambda drafter: decoder,
        tokenizer,
        chosen.items,
        policy,
        RuleRouter(),
        config,
        held_out=HeldOut(chosen.tuned, chosen.in_sample),
    )
    return policy, chosen, runs


def test_every_cell_shows_the_policys_prediction_beside_the_measurement(tiny_bench, tmp_path):
    policy, chosen, runs = tiny_bench
    assert all(len(r.repeat_times_s) == 2 for r in runs)
    assert {r.in_sample for r in runs} == {r.prompt_id in chosen.in_sample_ids for r in runs}
    path = policy.save(tmp_path / "policy.json")
    predictions = policy_predictions(path)
    assert predictions["code"].tokens_per_step == Prediction(2.5, 2.3, 2.7)
    assert predictions["code"].speedup == 1.3
    assert predictions[ALL_DOMAINS].tokens_per_step.extrapolated
    rows = summarize_bench(runs)
    fitted = chosen.tuning_per_domain
    assert fitted == {"code": 120}
    cells = {
        (c.method, c.domain): c
        for c in predicted_vs_measured(rows, runs, predictions, None, fitted)
    }
    assert set(cells) == {("chain", "code"), ("uniform", "code"), ("routed", "code")}
    assert cells["chain", "code"].predicted is None  # the policy predicts no fixed chain
    assert cells["uniform", "code"].predicted == predictions[ALL_DOMAINS]
    routed = cells["routed", "code"]
    assert routed.predicted == predictions["code"]
    measured = next(r for r in rows if (r.method, r.domain) == ("routed", "code"))
    assert routed.tokens_per_step == measured.tau and routed.speedup == measured.speedup
    # the policy's interval [2.3, 2.7] of 120 tuning prompts, widened for a mean of 3 others
    widen = math.sqrt(1 + 120 / 3)
    assert routed.tokens_interval == pytest.approx((2.5 - 0.2 * widen, 2.5 + 0.2 * widen))
    assert routed.tokens_inside == (2.5 - 0.2 * widen <= measured.tau <= 2.5 + 0.2 * widen)
    assert cells["uniform", "code"].tokens_inside is None  # extrapolated: no interval
    assert routed.in_sample == len(chosen.in_sample_ids) > 0
    text = to_markdown(prediction_grid(tuple(cells.values()), chosen.tuned))
    assert "2.50 \\[2.30, 2.70\\] (replay)" in text and "1.30x" in text and "tuning runs r1" in text
    assert "\\[1.22, 3.78\\]" in text  # for these 3 prompts
    precision = speedup_precision(runs, n_boot=200)
    assert {(p.method, p.domain) for p in precision} == set(cells)
    assert all(p.repeats == 2 and p.prompts == 3 for p in precision)
    assert "narrow enough" in to_markdown(precision_grid(precision))
    doc = json.loads(json_text(checks_document(chosen, tuple(cells.values()), precision)))
    assert doc["held_out"]["tuning_runs"] == ["r1"] and doc["held_out"]["in_sample_allowed"]
    assert doc["held_out"]["in_sample_prompts"] == sorted(chosen.in_sample_ids)
    routed_doc = next(c for c in doc["predicted_vs_measured"] if c["method"] == "routed")
    assert routed_doc["predicted_tokens_per_step"] == {
        "tokens_per_step": 2.5,
        "interval": [2.3, 2.7],
        "method": "replay",
    }
    assert routed_doc["held_out_interval"] == pytest.approx([2.5 - 0.2 * widen, 2.5 + 0.2 * widen])
    assert routed_doc["predicted_speedup"] == 1.3 and routed_doc["in_sample"] >= 1
    assert len(doc["precision"]) == 3 and "narrow_enough" in doc["precision"][0]


def test_a_policy_without_predictions_predicts_no_cell(tmp_path):
    path = _policy(predictions=False).save(tmp_path / "hand.json")
    assert policy_predictions(path) == {}


# --- is the interval narrow enough -----------------------------------------------------------------


def _runs(speedups, repeat_noise=(0.0, 0.0), tokens: int = 11) -> list[BenchRun]:
    """One prompt per speed-up: plain takes 1 s after its first token in every repeat, the
    method 1/speed-up s times (1 + each repeat's noise)."""
    runs = []
    for i, s in enumerate(speedups):
        for method, base in (("plain", 1.0), ("chain", 1.0 / s)):
            noise = repeat_noise if method == "chain" else (0.0,) * len(repeat_noise)
            times = tuple(0.5 + base * (1 + e) for e in noise)
            runs.append(
                BenchRun(method, f"p{i}", "code", "", (1,) * tokens, 5, times[0], 0.5, times,
                         (0.5,) * len(times))
            )  # fmt: skip
    return runs


def test_tokens_the_first_step_brought_are_not_decoded_in_the_time_after_it():
    """A method whose first step emits 4 tokens (assisted generation drafting in its first
    pass) at the first-token time: 7 tokens in 0.7 s after it decode as fast as plain's 10 in
    1 s, a speed-up of exactly 1 (counting the first step's 3 extra tokens gave 1.43x)."""
    plain = BenchRun("plain", "p0", "code", "", (1,) * 11, 11, 1.5, 0.5, (1.5,), (0.5,))
    mine = BenchRun("assisted", "p0", "code", "", (1,) * 11, 3, 1.2, 0.5, (1.2,), (0.5,),
                    first_tokens=4)  # fmt: skip
    row = next(r for r in summarize_bench([plain, mine], n_boot=10) if r.method == "assisted")
    assert row.decode_tokens_per_s == pytest.approx(10.0) and row.speedup == pytest.approx(1.0)
    (p,) = speedup_precision([plain, mine], n_boot=10)
    assert p.speedup == pytest.approx(1.0)
    old = BenchRun.from_dict(
        {k: v for k, v in dataclasses.asdict(mine).items() if k != "first_tokens"}
    )
    assert old.first_tokens == 1  # a bench file from before first_tokens: one token, as written


def test_equal_prompts_and_repeats_give_a_point_interval_that_is_narrow_enough():
    (p,) = speedup_precision(_runs([2.0] * 6), n_boot=500)
    assert p.speedup == pytest.approx(2.0) and p.lo == pytest.approx(2.0)
    assert p.hi == pytest.approx(2.0) and p.narrow_enough
    assert (p.prompts_needed, p.repeats_needed) == (6, 2)


def test_spread_across_prompts_needs_more_prompts_in_proportion_to_the_width_squared():
    (p,) = speedup_precision(_runs([1.2, 1.6, 2.0, 2.4, 2.8, 3.2]), n_boot=2000)
    assert p.lo < p.speedup < p.hi and not p.narrow_enough
    assert p.prompts_needed == math.ceil(6 * (p.half_width / 0.05) ** 2)
    assert p.repeats_needed is None  # repeats do not vary: only prompts can narrow it
    text = to_markdown(precision_grid([p]))
    assert f"~{p.prompts_needed} prompts" in text and "repeats alone cannot" in text


def test_noise_between_repeats_can_be_averaged_away_by_repeats_only():
    # every prompt 2x in both repeats, but the second repeat 30% slower for the method on every
    # prompt (its servers): no number of prompts can narrow that, more repeats can
    (p,) = speedup_precision(_runs([2.0] * 6, repeat_noise=(-0.3, 0.3)), n_boot=2000)
    assert not p.narrow_enough and p.repeats_needed is not None and p.repeats_needed > 2
    assert p.prompts_needed is None and p.repeat_share == pytest.approx(1.0)
    assert "prompts alone cannot get there" in to_markdown(precision_grid([p]))
    with pytest.raises(BenchError, match="fraction in \\(0, 1\\)"):
        speedup_precision(_runs([2.0] * 2), target=5)


def test_a_repeat_effect_widens_the_bench_table_interval_too():
    """The same prompts with and without a repeat effect common to them: the bench table's
    interval widens by it (it resampled prompts alone before), and one repeat gives no
    verdict."""
    speedups = [1.8, 1.9, 2.0, 2.1, 2.2, 2.0]
    quiet, noisy = _runs(speedups, (0.0, 0.0)), _runs(speedups, (-0.05, 0.05))

    def width(runs):
        row = next(r for r in summarize_bench(runs, n_boot=500) if r.method == "chain")
        return row.speedup_hi - row.speedup_lo

    assert width(noisy) > 2 * width(quiet)
    (one,) = speedup_precision(_runs(speedups), n_boot=200)  # one repeat: (0.0, 0.0) -> R = 2
    single = [dataclasses.replace(r, repeat_times_s=r.repeat_times_s[:1],
                                  repeat_first_token_s=r.repeat_first_token_s[:1])
              for r in _runs(speedups)]  # fmt: skip
    (p,) = speedup_precision(single, n_boot=200)
    assert p.repeats == 1 and not p.narrow_enough and math.isnan(p.repeat_share)
    assert one.repeats == 2 and math.isfinite(one.repeat_share)
    assert "not testable" in to_markdown(precision_grid([p]))
    # a spread across prompts and a repeat effect, each too wide alone: both must grow
    (both,) = speedup_precision(_runs([1.2, 1.6, 2.0, 2.4, 2.8, 3.2], (-0.3, 0.3)), n_boot=500)
    assert both.prompts_needed is None and both.repeats_needed is None
    assert "neither alone can get there" in to_markdown(precision_grid([both]))


def test_one_prompt_gives_no_interval_to_scale():
    (p,) = speedup_precision(_runs([2.0], repeat_noise=(-0.1, 0.1)), n_boot=200)
    assert math.isnan(p.lo) and not p.narrow_enough and p.prompts_needed is None
    assert "one prompt gives no interval" in to_markdown(precision_grid([p]))
    assert np.isfinite(p.speedup)


# --- the command ---------------------------------------------------------------------------------


def _bench_cli(tiny_dirs, policy_path, *extra):
    from typer.testing import CliRunner

    from conftest import tiny_pair_args
    from specscope.cli import app

    args = ["bench", "--policy-file", policy_path, "--domains", "code", "--per-domain", 2,
            "--max-new-tokens", 4, "--repeats", 2, "--warmup", 0, "--methods",
            "plain,chain,routed", *extra, *tiny_pair_args(tiny_dirs)]  # fmt: skip
    return CliRunner().invoke(app, [str(a) for a in args])


def test_the_bench_command_refuses_tuning_prompts_and_prints_what_it_confirms(tiny_dirs, tmp_path):
    everything = _policy({"run_id": "r1", "prompt_ids": CODE_IDS}).save(tmp_path / "all.json")
    refused = _bench_cli(tiny_dirs, everything)
    assert refused.exit_code == 2  # an expected failure: one line, no traceback
    assert "'code' has 0 held-out prompts" in refused.output
    out = tmp_path / "bench.json"
    labelled = _bench_cli(tiny_dirs, everything, "--in-sample", "-o", out)
    assert labelled.exit_code == 0, labelled.output
    assert "predicted (policy file, before the bench) against measured" in labelled.output
    assert "2 (2 in-sample)" in labelled.output and "narrow enough" in labelled.output
    doc = json.loads(out.read_text())
    assert len(doc["held_out"]["in_sample_prompts"]) == 2
    assert {c["method"] for c in doc["predicted_vs_measured"]} == {"chain", "routed"}
    assert all(r["in_sample"] for r in doc["runs"])


def test_measurement_and_every_bench_method_give_the_same_greedy_output(tiny_dirs, tmp_path):
    """One pair in float32: the measurement run's recorded outputs, plain greedy (transformers),
    the chain and the routed policy in the bench are one output per prompt, token for token, and
    the chain's steps equal the replay of the run on the very prompts timed
    (scripts/same_prompts.py)."""
    from typer.testing import CliRunner

    from conftest import tiny_pair_args
    from specscope.cli import app
    from specscope.records import load_run

    run_dir = tmp_path / "run"
    measured = CliRunner().invoke(
        app,
        ["run", "--out", str(run_dir), "--domains", "code", "--per-domain", "2",
         "--max-new-tokens", "6", "--policy", "chain", "--depth", "2", "--quiet",
         *tiny_pair_args(tiny_dirs)],
    )  # fmt: skip
    assert measured.exit_code == 0, measured.output
    ids = list(load_run(run_dir).prompts.prompt_id)
    policy = _policy({"run_dir": str(run_dir), "run_id": "r", "prompt_ids": ids})
    path = policy.save(tmp_path / "policy.json")
    out = tmp_path / "bench.json"
    result = _bench_cli(
        tiny_dirs, path, "--tuning-prompts", "--max-new-tokens", 6, "--chain-depth", 2, "-o", out
    )
    assert result.exit_code == 0, result.output
    assert "greedy outputs against" in result.output
    agreement = {a["method"]: a for a in json.loads(out.read_text())["outputs_vs_run"]}
    assert set(agreement) == {"plain", "chain", "routed"}
    for a in agreement.values():
        assert (a["prompts"], a["equal"], a["first_difference"]) == (2, 2, [])
    # the replay of the very prompts timed: the chain's steps equal, prompt by prompt
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "scripts" / "same_prompts.py"
    table = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, check=True
    ).stdout
    (chain,) = [line for line in table.splitlines() if line.startswith("| chain")]
    cells = [c.strip() for c in chain.strip("|").split("|")]
    assert cells[2] == "2" and cells[3] == cells[4] and cells[6:] == ["2", "2"], table


# --- a method decoding as another is not timed twice; the policy's decisions scored ------------


def test_routed_to_a_timed_setting_is_that_methods_run_and_its_regret_is_scored(tokenizer):
    from specscope.tune.bench import policy_choices
    from specscope.tune.study import decide

    def bench_decision(policy, config, domains, rows, runs):
        choices = policy_choices(policy, config, domains)
        return decide(choices, domains, rows, runs, config.methods, derived=("routed",))

    torch.set_num_threads(1)
    draft, target = near_pair("qwen2", len(tokenizer), noise=0.05)
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    policy = _policy({"run_id": "r1", "prompt_ids": CODE_IDS[:120]})  # code: chain(2)
    chosen = bench_prompts(["code"], 3, 42, policy)
    config = BenchConfig(
        max_new_tokens=6,
        warmup=0,
        repeats=2,
        chain_depth=2,
        methods=("plain", "chain", "uniform", "routed"),
    )
    # a bench record's config reads back as the config it was
    assert BenchConfig.from_dict(json.loads(json_text(dataclasses.asdict(config)))) == config
    runs = bench_decoder(
        lambda drafter: decoder, tokenizer, chosen.items, policy, RuleRouter(), config
    )
    by = {(r.method, r.prompt_id): r for r in runs}
    for item in chosen.items:
        routed, chain = by["routed", item.id], by["chain", item.id]
        assert routed.routed_to == "code" and chain.routed_to == ""
        # the same run: the same repeat times, not a second timing that happens to agree
        assert routed.repeat_times_s == chain.repeat_times_s and routed.tokens == chain.tokens
        assert by["uniform", item.id].repeat_times_s != chain.repeat_times_s
    assert policy_choices(policy, config, ["code", "math"]) == {"code": "chain", "math": "uniform"}
    rows = summarize_bench(runs)
    decision = bench_decision(policy, config, ["code"], rows, runs)
    (regret,) = decision.regret
    speedups = {r.method: r.speedup for r in rows if r.domain == "code"}
    best = max(("plain", "chain", "uniform"), key=speedups.__getitem__)
    assert (regret.chosen, regret.best) == ("chain", best)
    assert regret.regret == pytest.approx(1 - speedups["chain"] / speedups[best])
    single = decision.routed_vs_best_single
    assert single.best_single == best and single.prompts == 3
    # routed is the chain on every prompt: against the chain it is 1 exactly
    assert best != "chain" or single.ratio == pytest.approx(1.0)
    assert decision.unscored == ()
    # a choice timed only inside routed is scored on the prompts routed to its domain's entry
    # (all 3 here), against every method on them
    untimed = dataclasses.replace(config, methods=("plain", "uniform", "routed"))
    (by_route,) = bench_decision(policy, untimed, ["code"], rows, runs).regret
    assert (by_route.chosen, by_route.prompts) == ("routed", 3)
    assert by_route.chosen_speedup == pytest.approx(speedups["routed"])
    assert by_route.best_speedup == pytest.approx(max(speedups.values()))
    assert "routed (3 prompts)" in to_markdown(regret_grid([by_route]))
    # one timed by no method, nor by routed, is named, not left out silently
    alone = [r for r in runs if r.method != "routed"]
    unrouted = dataclasses.replace(config, methods=("plain", "uniform"))
    unscored = bench_decision(policy, unrouted, ["code"], summarize_bench(alone), alone)
    assert unscored.to_dict() == {"unscored": ["code"]}
    assert "Not scored: code" in to_markdown(regret_grid((), unscored.unscored))


# --- an interrupted bench resumes where it stopped -------------------------------------------------


def test_an_interrupted_bench_resumes_after_its_last_timed_prompt(tokenizer, tmp_path):
    from specscope.progress import reporting
    from specscope.tune.backends import Request
    from specscope.tune.bench import BenchCheckpoint

    torch.set_num_threads(1)
    draft, target = near_pair("qwen2", len(tokenizer), noise=0.05)
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    policy = _policy({"run_id": "r1", "prompt_ids": CODE_IDS[:120]})
    chosen = bench_prompts(["code", "math"], 2, 42, policy, split=False)
    # the domains take turns: a bench stopped early holds every domain
    assert [i.domain for i in chosen.items] == ["code", "math", "code", "math"]
    config = BenchConfig(max_new_tokens=4, warmup=0, repeats=1, methods=("plain", "chain"))
    key = {"config": dataclasses.asdict(config), "prompts": [i.id for i in chosen.items]}
    checkpoint = BenchCheckpoint(tmp_path / "bench.json.partial.jsonl", key)
    logged: list[str] = []

    class Interrupted(Exception):
        pass

    class Progress:  # the bench's progress: interrupted once two prompts are timed
        def __init__(self, stop_at=None):
            self.stop_at, self.seen = stop_at, []

        def start(self, what, unit, tally):
            self.seen.append(("start", tally.done, tally.total))

        def update(self, tally):
            if tally.done == self.stop_at:
                raise Interrupted
            self.seen.append(tally.done)

        def note(self, message, level="info"):
            pass

        def stop(self):
            pass

    def bench(progress):
        with reporting(progress):
            return bench_decoder(lambda drafter: decoder, tokenizer, chosen.items, policy,
                             RuleRouter(), config, log=logged.append, checkpoint=checkpoint)  # fmt: skip

    with pytest.raises(Interrupted):
        bench(Progress(stop_at=2))
    lines = checkpoint.path.read_text().splitlines()
    assert len(lines) == 1 + 2  # the key, then the two prompts timed whole
    with checkpoint.path.open("a") as f:
        f.write('[{"method": "plain", "prom')  # a line cut short by the interruption
    progress = Progress()
    runs = bench(progress)
    assert logged == ["resuming: 2 of 4 rounds timed before (" + str(checkpoint.path) + ")"]
    assert progress.seen == [("start", 2, 4), 3, 4]  # no prompt twice
    assert [(r.method, r.prompt_id) for r in runs] == [
        (m, i.id) for i in chosen.items for m in ("plain", "chain")
    ]
    first = [Request.from_dict(r) for r in json.loads(lines[1])]  # a round's requests, whole
    assert {(r.method, r.prompt_id, r.repeat) for r in first} == {
        (m, chosen.items[0].id, 0) for m in ("plain", "chain")
    }
    assert runs[0].tokens == next(r.output_ids for r in first if r.method == "plain")
    assert len(checkpoint.path.read_text().splitlines()) == 1 + 4  # the cut line dropped
    other = BenchCheckpoint(checkpoint.path, {**key, "prompts": key["prompts"][:2]})
    with pytest.raises(BenchError, match="holds a bench of other settings"):
        other.load()


def test_the_least_ratio_takes_its_lower_end_alone_and_its_upper_end_held_together():
    """Two ratios with a standard error of 0.01 on 10 degrees of freedom: the least true ratio
    is one of them, so its lower end is the lesser lower end at 95% each (t 2.228), its upper
    end the lesser upper end at 97.5% each (t 2.634), both here the lesser ratio's."""
    a = Estimate(1.00, se=0.01, df=10)
    b = Estimate(0.99, se=0.01, df=10)
    least = least_ratio({"a": a, "b": b})
    assert least.lo == pytest.approx(0.99 - 2.2281 * 0.01, abs=1e-4) and least.lo_by == "b"
    assert least.hi == pytest.approx(0.99 + 2.6338 * 0.01, abs=1e-4) and least.hi_by == "b"
    wide = least_ratio({"a": a, "b": Estimate(1.20, se=0.2, df=2)})
    # a ratio of 1.2 measured loosely (2 degrees of freedom) sets the lower end all the same
    assert wide.lo_by == "b" and wide.hi_by == "a"
    assert wide.lo == pytest.approx(1.20 - 4.3027 * 0.2, abs=1e-3)
