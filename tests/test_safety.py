"""Nothing lost, nothing misread: safe overwrites, checked inputs, runs that know what they hold.

Each test is one case a careful user tried on a tiny random pair; the comment says what happened
before. Every failure must be one line (exit status 2) and leave the user's files as they were.
"""

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from conftest import small_run_config, tiny_pair_args
from lab.synthetic import write_synthetic_run
from specscope.analysis import Settings, analyze
from specscope.analysis.render import analysis_grids
from specscope.cache import recorded_path
from specscope.cli import app
from specscope.errors import SpecscopeError
from specscope.records import RunDirError, load_run
from specscope.run.config import RunConfigError
from specscope.run.study import run_study
from specscope.sweep import SweepError, parse_sweep, run_sweep
from specscope.trees import TreeConfigError

cli = CliRunner()


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "domain": "code", "prompt": f"Say {i}."}) + "\n"
            for i in range(3)
        )
    )
    return path


def _run_args(tiny_dirs, prompts, out, *extra):
    return [
        "run",
        "--out",
        str(out),
        *tiny_pair_args(tiny_dirs),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "3",
        "--quiet",
        *extra,
    ]


def _one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, result.output


# --- data loss -------------------------------------------------------------------------------------


def test_overwrite_never_deletes_a_directory_that_is_not_a_run(tiny_dirs, prompts, tmp_path):
    # before: `--overwrite` removed u/ (and thesis.txt) even though the draft path was a typo
    user = tmp_path / "u"
    user.mkdir()
    (user / "thesis.txt").write_text("x")
    bad = _run_args(tiny_dirs, prompts, user, "--overwrite")
    bad[bad.index("--draft") + 1] = str(tmp_path / "typo-path")
    _one_line_error(cli.invoke(app, bad))
    assert (user / "thesis.txt").read_text() == "x"
    # and with every input right it is still refused: --overwrite only replaces a run
    _one_line_error(
        cli.invoke(app, _run_args(tiny_dirs, prompts, user, "--overwrite")),
        "is not a specscope run",
    )
    assert (user / "thesis.txt").read_text() == "x"


def test_overwrite_removes_a_run_only_after_every_input_is_checked(tiny_dirs, prompts, tmp_path):
    out = tmp_path / "r"
    run_study(small_run_config(tiny_dirs, prompts), out, progress=False)
    (out / "notes.txt").write_text("mine")
    before = (out / "nodes.parquet").read_bytes()
    with pytest.raises(SpecscopeError):
        run_study(
            small_run_config(tiny_dirs, prompts, max_new_tokens=2).replace(
                **{"pair.device": "cuda:7"}
            ),
            out,
            overwrite=True,
            progress=False,
        )
    assert (out / "nodes.parquet").read_bytes() == before  # untouched by the failed overwrite
    run_study(
        small_run_config(tiny_dirs, prompts, max_new_tokens=2), out, overwrite=True, progress=False
    )
    assert load_run(out).steps.step.max() == 1
    assert (out / "notes.txt").read_text() == "mine"  # only what specscope wrote was replaced


def test_sweep_overwrite_keeps_what_is_not_a_sweep(tiny_dirs, prompts, tmp_path):
    user = tmp_path / "s"
    user.mkdir()
    (user / "thesis.txt").write_text("x")
    spec = parse_sweep(
        {
            "defaults": {"max_new_tokens": 2, "prompts": {"file": str(prompts)}},
            "pairs": [
                {
                    "draft": str(tiny_dirs["qwen2", "draft"]),
                    "target": str(tiny_dirs["qwen2", "target"]),
                    "dtype": "float32",
                }
            ],
        }
    )
    with pytest.raises(SweepError, match="not a specscope sweep"):
        run_sweep(spec, user, overwrite=True, progress=False)
    assert (user / "thesis.txt").read_text() == "x"
    out = tmp_path / "sweep"
    run_sweep(spec, out, progress=False)
    typo = parse_sweep(
        {
            "defaults": {"max_new_tokens": 2, "prompts": {"file": str(prompts)}},
            "pairs": [
                {
                    "draft": str(tmp_path / "typo"),
                    "target": str(tmp_path / "typo"),
                    "dtype": "float32",
                }
            ],
        }
    )
    with pytest.raises(SpecscopeError, match="typo"):
        run_sweep(typo, out, overwrite=True, progress=False)
    assert (out / "sweep.json").is_file() and (out / "runs").is_dir()


def test_a_failed_start_does_not_block_the_corrected_command(tiny_dirs, prompts, tmp_path):
    # before: a run that died before its first prompt left a "running" manifest that refused the
    # corrected command as "a different config"
    out = tmp_path / "r"
    with pytest.raises(TreeConfigError, match="rank 5000, but the vocabulary has 259 tokens"):
        run_study(
            small_run_config(tiny_dirs, prompts).replace(
                **{"tree.policy": "static", "tree.paths": "[(0,), (5000,)]"}
            ),
            out,
            progress=False,
        )
    assert not (out / "manifest.json").exists()  # refused before anything was written
    out.mkdir(exist_ok=True)
    (out / "manifest.json").write_text(
        json.dumps({"schema_version": 1, "run_id": "older", "status": "running", "config": {}})
    )
    run_study(
        small_run_config(tiny_dirs, prompts), out, progress=False
    )  # nothing committed: replaced
    assert len(load_run(out).prompts) == 3


# --- a run knows what it holds ---------------------------------------------------------------------


def test_resume_refuses_an_edited_prompt(tiny_dirs, prompts, tmp_path):
    out = tmp_path / "r"
    run_study(small_run_config(tiny_dirs, prompts), out, progress=False)
    prompts.write_text(prompts.read_text().replace("Say 1.", "Say one hundred."))
    with pytest.raises(RunConfigError, match="prompt.*q1 changed"):
        run_study(small_run_config(tiny_dirs, prompts), out, progress=False)


def test_resume_refuses_new_weights_under_the_same_path(tiny_dirs, prompts, tmp_path):
    model = tmp_path / "target"
    shutil.copytree(tiny_dirs["qwen2", "target"], model)
    config = small_run_config(tiny_dirs, prompts).replace(**{"pair.target": str(model)})
    out = tmp_path / "r"
    run_study(config, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    target = manifest["models"]["target"]
    assert target["source"] == recorded_path(model.resolve()) and len(target["fingerprint"]) == 64
    weights = next(model.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)
    weights.write_bytes(bytes(data))
    with pytest.raises(RunConfigError, match="target model .* changed"):
        run_study(config, out, progress=False)


# --- silently misread input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, message",
    [
        ('chat_template = "no"', "chat_template must be true or false, got 'no'"),
        ("max_new_tokens = 4.5", "max_new_tokens must be an integer, got 4.5"),
        ('seed = "abc"', "seed must be an integer, got 'abc'"),
        ('[tree]\ndepth = "3"', "tree.depth must be an integer"),
    ],
)
def test_config_values_of_the_wrong_type_name_the_field(
    tiny_dirs, prompts, tmp_path, line, message
):
    toml = tmp_path / "c.toml"
    toml.write_text(line + "\n")
    _one_line_error(
        cli.invoke(app, _run_args(tiny_dirs, prompts, tmp_path / "o", "-c", str(toml))), message
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--paths", "[(0,), (1,)]"], "paths apply only to policy 'static', not 'paper'"),
        (["--policy", "chain", "--top-k", "4"], "--top-k do(es) not apply to tree policy 'chain'"),
    ],
)
def test_options_of_another_policy_are_rejected(tiny_dirs, prompts, tmp_path, extra, message):
    # before: --paths without --policy static was stored and ignored (the paper tree was measured)
    _one_line_error(cli.invoke(app, _run_args(tiny_dirs, prompts, tmp_path / "o", *extra)), message)


def test_an_empty_sweep_axis_is_an_error():
    with pytest.raises(SweepError, match="trees: an empty list"):
        parse_sweep({"trees": []})
    with pytest.raises(SweepError, match=r"trees\[0\].depth: an empty list"):
        parse_sweep({"trees": [{"policy": "chain", "depth": []}]})
    with pytest.raises(SweepError, match=r"\[decode\].rendering: an empty list"):
        parse_sweep({"decode": {"rendering": []}})


def test_policy_file_with_an_unknown_domain(tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "format": "specscope-policy/1",
                "domains": {"code": {"tree": "[(0,)]"}},
                "uniform": {"tree": "none"},
            }
        )
    )
    result = cli.invoke(app, ["decode", "hi", "--policy-file", str(policy), "--domain", "cooking"])
    _one_line_error(result, "has no domain 'cooking'; it has code")


def test_table_two_does_not_answer_from_a_point_value(tmp_path):
    run = write_synthetic_run(tmp_path / "r", prompts_per_domain=4, steps=8, seed=1)
    a = analyze(run, Settings(n_boot=0))
    grid = next(g for g in analysis_grids(a) if g.key == "table2")
    answers = {row[-1] for row in grid.rows}
    assert answers == {"unclear (no interval)"}


# --- corruption ------------------------------------------------------------------------------------


def test_overwritten_bytes_are_detected_when_read(tiny_dirs, prompts, tmp_path):
    # before: 200 bytes overwritten in steps.parquet gave exit 0 and a median certificate of
    # 2,261,634 nats
    out = tmp_path / "r"
    from specscope.theory import CriteriaConfig

    run_study(small_run_config(tiny_dirs, prompts, criteria=CriteriaConfig()), out, progress=False)
    steps = out / "steps.parquet"
    data = bytearray(steps.read_bytes())
    data[100:300] = bytes([0x7F]) * 200
    steps.write_bytes(bytes(data))
    for command in (["certify", str(out)], ["analyze", str(out), "--no-plots", "--show", "none"]):
        _one_line_error(cli.invoke(app, command), str(out))


def test_values_out_of_range_are_named(tmp_path):
    run = write_synthetic_run(tmp_path / "r", prompts_per_domain=2, steps=4, seed=0)
    import pyarrow.parquet as pq

    table = pq.read_table(run / "nodes.parquet").to_pandas()
    table.loc[3, "p_target"] = 2_261_634.0
    table.to_parquet(run / "nodes.parquet", index=False)
    with pytest.raises(RunDirError, match=r"1 nodes rows have p_target outside \[0, 1"):
        load_run(run)


def test_a_truncated_consolidated_file_is_rebuilt_from_parts(tiny_dirs, prompts, tmp_path):
    # before: the rerun said "complete" and analysis read the damaged file
    out = tmp_path / "r"
    run_study(small_run_config(tiny_dirs, prompts), out, progress=False)
    good = load_run(out).nodes
    nodes = out / "nodes.parquet"
    nodes.write_bytes(nodes.read_bytes()[: nodes.stat().st_size // 2])
    with pytest.raises(RunDirError, match="nodes"):
        load_run(out)
    summary = run_study(small_run_config(tiny_dirs, prompts), out, progress=False)
    assert summary.already_complete
    assert load_run(out).nodes.equals(good)


# --- tracebacks that are now one-line errors -------------------------------------------------------


def test_non_utf8_prompt_file(tiny_dirs, tmp_path):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"id": "a", "domain": "code", "prompt": "caf\xe9"}\n')
    _one_line_error(
        cli.invoke(app, _run_args(tiny_dirs, bad, tmp_path / "o")), "latin1.jsonl:1: not UTF-8"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu(tiny_dirs, prompts, tmp_path):
    _one_line_error(
        cli.invoke(app, _run_args(tiny_dirs, prompts, tmp_path / "o", "--device", "cuda:0")),
        "sees no CUDA GPU",
    )
    assert not (tmp_path / "o").exists()


def test_empty_and_tokenizer_only_model_directories(tiny_dirs, prompts, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    tok_only = tmp_path / "tok"
    tok_only.mkdir()
    for f in tiny_dirs["qwen2", "draft"].iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tok_only / f.name)
    for model in (empty, tok_only):
        args = _run_args(tiny_dirs, prompts, tmp_path / "o")
        args[args.index("--draft") + 1] = str(model)
        _one_line_error(cli.invoke(app, args), "not a transformers checkpoint")


def test_out_that_is_a_file(tiny_dirs, prompts, tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    _one_line_error(cli.invoke(app, _run_args(tiny_dirs, prompts, target)), "is a file")
    _one_line_error(cli.invoke(app, _run_args(tiny_dirs, prompts, target / "sub")), "is a file")
    assert target.read_text() == "x"


def test_report_and_certify_outputs_are_checked(tmp_path):
    run = write_synthetic_run(tmp_path / "r", prompts_per_domain=2, steps=4, seed=0)
    _one_line_error(
        cli.invoke(app, ["report", str(run), "--out", str(tmp_path)]),
        "is a directory; give a file name ending in .html",
    )
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    _one_line_error(cli.invoke(app, ["certify", str(run), "--out", str(blocker)]), "is a file")


def test_bench_needs_a_prompt_per_domain():
    result = cli.invoke(app, ["bench", "--per-domain", "0"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_cost_measurement_on_a_vocabulary_under_1000_tokens(tokenizer):
    # before: _time_forward drew token ids from randint(0, 1000) whatever the vocabulary
    from specscope.decode import SpeculativeDecoder
    from specscope.models.tiny import tiny_model
    from specscope.tune.costs import measure_costs

    draft, target = (
        tiny_model("llama", len(tokenizer), 1, 1),
        tiny_model("llama", len(tokenizer), 2),
    )
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    costs = measure_costs(decoder, context_len=16, sizes=(1, 2), repeats=1)
    assert len(tokenizer) < 1000 and costs.plain_token_s > 0
