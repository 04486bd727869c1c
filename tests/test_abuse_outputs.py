"""Issue 25, outputs: what specscope writes and the numbers it is given, under abuse.

Covers: analyze/report/certify/tune/llamacpp outputs never written through links planted in a
(downloaded) run directory (case 5); ``-o`` of export, tune, bench and decode --records is a FIFO
written in place, a link replaced rather than followed, modes that follow the umask (case 6), never
an input or a run's own file (case 7); strict JSON policies and cost models (case 12); numeric
options, cost models and policy ranks checked by type and range (case 13); and one ``error:`` line,
exit 2, where a traceback came before (policy files, -o paths, prompt files, ranks beyond the
vocabulary, dynamic top_k, bench with one domain, tune -o a directory, empty costs).
Each test's comment says what happened before.
"""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
from typer.testing import CliRunner

from conftest import tiny_pair_args
from lab.synthetic import write_synthetic_run
from specscope.cli import app
from specscope.drafters import DrafterConfig
from specscope.trees import TreeShape
from specscope.tune.acceptance import PolicyError
from specscope.tune.costs import CostModel
from specscope.tune.policy import PolicyFile

CHAIN2 = TreeShape.from_paths([(0,), (0, 0)])
COSTS = CostModel(
    draft_s=((1, 0.01), (8, 0.012), (64, 0.03)),
    target_s=((1, 0.1), (8, 0.11), (16, 0.13), (64, 0.4)),
    plain_token_s=0.1,
    drafter=DrafterConfig(),  # the drafter of the run_dir fixture's run
)


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line_error(result, *needles):
    """Exit 2 with exactly one line, ``error: ...``, holding every needle; no traceback."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, as strict parsers do."""

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def run_dir(tmp_path):
    return write_synthetic_run(tmp_path / "run", prompts_per_domain=10, steps=8)


@pytest.fixture
def costs(tmp_path):
    return COSTS.save(tmp_path / "costs.json")


@pytest.fixture
def policy(tmp_path):
    path = tmp_path / "policy.json"
    PolicyFile(trees={"code": CHAIN2, "chat": None}, uniform=CHAIN2).save(path)
    return path


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_text("precious\n")
    return path


# Models that fail to load at once: a command that should refuse before loading them never gets
# that far (and old code that loaded them first fails fast instead of fetching the demo pair).
NO_PAIR = ["--draft", "/nonexistent/draft", "--target", "/nonexistent/target"]


# --- case 5: no writes through links planted in a run directory ---------------------------------


def test_analyze_refuses_a_planted_link_to_a_file_elsewhere(run_dir, victim):
    # before: analysis/tables.md -> victim: analyze overwrote the victim with its tables
    (run_dir / "analysis").mkdir()
    (run_dir / "analysis" / "tables.md").symlink_to(victim)
    result = _cli("analyze", run_dir, "--boot", 0, "--no-plots", "--show", "none")
    _one_line_error(result, "tables.md", "symbolic link")
    assert victim.read_text() == "precious\n"


def test_analyze_refuses_a_planted_analysis_directory_link(run_dir, victim):
    # before: analysis -> a directory elsewhere: every output was written into it
    (run_dir / "analysis").symlink_to(victim.parent, target_is_directory=True)
    result = _cli("analyze", run_dir, "--boot", 0, "--no-plots", "--show", "none")
    _one_line_error(result, "analysis", "symbolic link")
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]


def test_analyze_out_elsewhere_replaces_a_link_instead_of_following_it(run_dir, victim, tmp_path):
    # before: -o OUT whose tables.md was a link wrote through it into the victim
    out = tmp_path / "out"
    out.mkdir()
    (out / "tables.md").symlink_to(victim)
    result = _cli("analyze", run_dir, "-o", out, "--boot", 0, "--no-plots", "--show", "none")
    assert result.exit_code == 0, result.output
    assert (
        not (out / "tables.md").is_symlink()
        and "specscope analysis" in (out / "tables.md").read_text()
    )
    assert victim.read_text() == "precious\n"
    _strict((out / "analysis.json").read_text())


def test_report_refuses_a_planted_link(run_dir, victim):
    # before: report's default RUN_DIR/analysis/report.html was written through a planted link
    (run_dir / "analysis").mkdir()
    (run_dir / "analysis" / "report.html").symlink_to(victim)
    _one_line_error(_cli("report", run_dir, "--boot", 0, "--no-plots"), "symbolic link")
    assert victim.read_text() == "precious\n"


def test_tune_refuses_a_planted_policy_link(run_dir, costs, victim):
    # before: RUN_DIR/policy.json -> victim: tune overwrote the victim with the policy
    (run_dir / "policy.json").symlink_to(victim)
    result = _cli("tune", run_dir, "--costs", costs, "--min-count", 1)
    _one_line_error(result, "policy.json", "symbolic link")
    assert victim.read_text() == "precious\n"


def test_llamacpp_outputs_refuse_a_planted_link(run_dir, victim, tmp_path):
    # before: RUN_DIR/llamacpp -> elsewhere received policy.json, requests, bench, summary
    from specscope.files import OutputError
    from specscope.serving.llamacpp.study import LlamaTuneConfig, tune_llama_server

    (run_dir / "llamacpp").symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(OutputError, match="symbolic link"):  # before any server starts
        tune_llama_server(
            run_dir,
            run_dir / "llamacpp" / "policy.json",
            LlamaTuneConfig(
                ("ngram-simple",), target_gguf=tmp_path / "t.gguf", draft_gguf=tmp_path / "d.gguf"
            ),
        )
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]


# --- case 6: -o a FIFO, a link, modes -----------------------------------------------------------


def test_export_into_a_fifo_writes_in_place(policy, tmp_path):
    # before: the FIFO was replaced by a regular file and its reader got nothing
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = _cli("export", policy, "--to", "llama.cpp", "-o", fifo)
    reader.join(timeout=30)
    if reader.is_alive():  # nothing was written into the FIFO: release the reader
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _strict(received[0].decode())["engine"] == "llama.cpp"


def test_export_to_a_link_replaces_the_link_and_leaves_its_target(policy, victim, tmp_path):
    # decided: -o LINK (to a regular file) is replaced by the exported file, as any planted link
    # is; the file the link pointed to is left alone (write to the target by naming it)
    link = tmp_path / "settings.json"
    link.symlink_to(victim)
    result = _cli("export", policy, "--to", "llama.cpp", "-o", link)
    assert result.exit_code == 0, result.output
    assert not link.is_symlink() and _strict(link.read_text())["engine"] == "llama.cpp"
    assert victim.read_text() == "precious\n"


def test_export_modes_follow_the_umask_and_an_existing_file_keeps_its_mode(policy, tmp_path):
    # before: a new export was 0600 whatever the umask, and an existing 0644 file became 0600
    old = os.umask(0o002)
    try:
        new = tmp_path / "new.json"
        assert _cli("export", policy, "--to", "llama.cpp", "-o", new).exit_code == 0
        assert stat.S_IMODE(new.stat().st_mode) == 0o664
        existing = tmp_path / "existing.json"
        existing.write_text("{}")
        existing.chmod(0o644)
        assert _cli("export", policy, "--to", "llama.cpp", "-o", existing).exit_code == 0
        assert stat.S_IMODE(existing.stat().st_mode) == 0o644
        assert _strict(existing.read_text())["engine"] == "llama.cpp"
    finally:
        os.umask(old)


# --- case 7: -o never an input or a run's own file ----------------------------------------------


def test_export_refuses_to_overwrite_its_own_policy(policy):
    # before: export POLICY -o POLICY replaced the tuned policy with the export and exited 0
    before = policy.read_bytes()
    _one_line_error(_cli("export", policy, "--to", "llama.cpp", "-o", policy), "input")
    assert policy.read_bytes() == before


@pytest.mark.parametrize("owned", ["manifest.json", "nodes.parquet"])
def test_tune_refuses_a_runs_own_file(run_dir, costs, owned):
    # before: tune -o RUN_DIR/manifest.json (or nodes.parquet) wrote the policy over it
    before = (run_dir / owned).read_bytes()
    _one_line_error(_cli("tune", run_dir, "--costs", costs, "-o", run_dir / owned), "owns")
    assert (run_dir / owned).read_bytes() == before


def test_tune_refuses_its_costs_file_as_output(run_dir, costs):
    before = costs.read_bytes()
    _one_line_error(_cli("tune", run_dir, "--costs", costs, "-o", costs), "input")
    assert costs.read_bytes() == before


@pytest.mark.parametrize("owned", ["manifest.json", "nodes.parquet"])
def test_bench_refuses_a_runs_own_file_before_any_work(run_dir, owned):
    # before: bench timed every method, then wrote its JSON over the run's file
    before = (run_dir / owned).read_bytes()
    result = _cli("bench", "-o", run_dir / owned, *NO_PAIR)
    _one_line_error(result, "owns")
    assert (run_dir / owned).read_bytes() == before


def test_bench_refuses_its_policy_file_as_output(policy):
    before = policy.read_bytes()
    _one_line_error(_cli("bench", "--policy-file", policy, "-o", policy, *NO_PAIR), "input")
    assert policy.read_bytes() == before


def test_decode_records_refuse_an_input_or_a_runs_file(run_dir, tmp_path):
    # before: --records RUN_DIR/nodes.parquet was overwritten after decoding (or the prompt file)
    prompt = tmp_path / "prompt.jsonl"
    prompt.write_text("hello")
    _one_line_error(_cli("decode", "--prompt-file", prompt, "--records", prompt, *NO_PAIR), "input")
    before = (run_dir / "nodes.parquet").read_bytes()
    _one_line_error(_cli("decode", "hi", "--records", run_dir / "nodes.parquet", *NO_PAIR), "owns")
    assert (run_dir / "nodes.parquet").read_bytes() == before


@pytest.mark.parametrize("command", ["analyze", "certify"])
def test_analyze_and_certify_refuse_a_runs_parts_directory(run_dir, command):
    # before: analyze -o RUN_DIR/parts wrote its tables among the run's committed parts
    _one_line_error(_cli(command, run_dir, "-o", run_dir / "parts"), "owns")


# --- case 12: strict JSON ---------------------------------------------------------------------


def test_policy_and_costs_are_strict_json(run_dir, costs, tmp_path):
    # before: a NaN in a policy's or cost model's figures was written as the literal NaN
    path = tmp_path / "p.json"
    PolicyFile(trees={"code": CHAIN2}, info={"note": float("nan")}).save(path)
    assert _strict(path.read_text())["note"] is None
    result = _cli(
        "tune", run_dir, "--costs", costs, "--min-count", 1, "-o", tmp_path / "tuned.json"
    )
    assert result.exit_code == 0, result.output
    tuned = _strict((tmp_path / "tuned.json").read_text())
    assert tuned["cost_model"]["plain_token_s"] == 0.1
    _strict(costs.read_text())


# --- case 13: numbers by type and range ---------------------------------------------------------


def test_decode_refuses_a_negative_max_prompt_tokens():
    # before: --max-prompt-tokens -5 silently dropped the prompt's first 5 tokens
    result = _cli("decode", "hello", "--max-prompt-tokens", -5, *NO_PAIR)
    assert result.exit_code == 2 and "max-prompt-tokens" in result.output


@pytest.mark.parametrize("tree", [[[True]], [[0], [0, True]], [[0.5]], [["0"]]])
def test_policy_ranks_are_integers_not_booleans(tmp_path, tree):
    # before: [[true]] was read as rank 1 (a bool is an int in Python), [[0.5]] as rank 0
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"domains": {"code": {"tree": tree}}}))
    rank = r"domains\.code\.tree\[\d\]\[\d\] must be an integer, got"
    with pytest.raises(PolicyError, match=rank):
        PolicyFile.load(path)
    _one_line_error(_cli("export", path, "--to", "llama.cpp"), "must be an integer, got", str(path))


def test_tree_paths_literal_refuses_booleans():
    with pytest.raises(ValueError, match="sibling ranks must be integers"):
        TreeShape.parse("[(0,), (True,)]")


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda c: c["draft_s"][0].__setitem__(1, -0.01), "must be > 0"),
        (lambda c: c.__setitem__("plain_token_s", float("nan")), "finite"),
        (lambda c: c.__setitem__("plain_token_s", 0), "must be > 0"),
        (lambda c: c["target_s"][1].__setitem__(1, 0.0), "must be > 0"),
        (lambda c: c.__setitem__("draft_s", []), "draft_s is empty"),
        (lambda c: c.pop("target_s"), "target_s is missing; give a list"),
        (
            lambda c: c.__setitem__("plain_token_s", "0.1"),
            "plain_token_s must be a number, got '0.1'",
        ),
        (lambda c: c.__setitem__("plain_tokens_s", 0.1), "unknown key 'plain_tokens_s'; allowed: "),
        (lambda c: c.__setitem__("overhead_s", float("inf")), "finite"),
        (lambda c: c["draft_s"][0].__setitem__(0, True), "integer"),
    ],
)
def test_tune_refuses_impossible_costs(run_dir, tmp_path, change, needle):
    # before: negative, NaN or zero times were accepted (a NaN cost gave a policy with NaN
    # literals); empty tables or a missing key ended in a traceback
    document = COSTS.to_dict()
    change(document)
    bad = tmp_path / "bad-costs.json"
    bad.write_text(json.dumps(document))
    _one_line_error(
        _cli("tune", run_dir, "--costs", bad, "-o", tmp_path / "p.json"), needle, str(bad)
    )
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(
    "option, value",
    [
        ("--context-len", 0),
        ("--repeats", 0),
        ("--max-rank", 0),
        ("--min-count", -1),
        ("--min-speedup", "nan"),
    ],
)
def test_tune_refuses_out_of_range_options(run_dir, costs, option, value):
    # before: accepted (max_rank 0 meant "any rank", a NaN min_speedup never speculated)
    result = _cli("tune", run_dir, "--costs", costs, option, value)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


# --- tracebacks that are now one line ------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, needle",
    [
        ("latin1.json", b'{"domains": {"code": {"tree": "caf\xe9"}}}', "not UTF-8"),
        ("latin1.toml", b'[domains.code]\ntree = "caf\xe9"\n', "not UTF-8"),
        ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        ("list.json", b"[]", "must hold a JSON object"),
    ],
)
def test_export_of_an_unreadable_policy_is_one_line(tmp_path, name, content, needle):
    # before: UnicodeDecodeError / RecursionError tracebacks
    path = tmp_path / name
    path.write_bytes(content)
    _one_line_error(_cli("export", path, "--to", "llama.cpp"), needle, str(path))


def test_export_to_a_directory_or_under_a_file_is_one_line(policy, tmp_path):
    # before: IsADirectoryError / NotADirectoryError tracebacks
    _one_line_error(_cli("export", policy, "--to", "llama.cpp", "-o", tmp_path), "is a directory")
    _one_line_error(
        _cli("export", policy, "--to", "llama.cpp", "-o", policy / "x.json"),
        "is a file, not a directory",
    )


def test_decode_prompt_file_missing_or_a_directory_is_one_line(tmp_path):
    # before: FileNotFoundError / IsADirectoryError tracebacks
    _one_line_error(
        _cli("decode", "--prompt-file", tmp_path / "nope.txt", *NO_PAIR), "does not exist"
    )
    _one_line_error(_cli("decode", "--prompt-file", tmp_path, *NO_PAIR), "is a directory")


def test_tune_out_a_directory_is_refused_before_measuring(run_dir, tmp_path, monkeypatch):
    # before: the cost measurement ran (minutes on a real pair), then IsADirectoryError
    import specscope.tune.costs

    def measured(*_, **__):
        raise AssertionError("the costs were measured before -o was checked")

    monkeypatch.setattr(specscope.tune.costs, "measure_costs", measured)
    _one_line_error(_cli("tune", run_dir, "-o", tmp_path, *NO_PAIR), "is a directory")
    _one_line_error(_cli("tune", run_dir, "--save-costs", tmp_path, *NO_PAIR), "is a directory")


def test_bench_with_one_domain(tmp_path):
    # before: the learned router was always fitted, and a single domain failed in scikit-learn
    # (one class) even with --router rules
    from specscope.core.loop import DecodeError
    from specscope.tune.bench import bench_prompts

    chosen = bench_prompts(["code"], 1, 42, None, "rules")
    assert set(chosen.routers) == {"rules"} and [i.domain for i in chosen.items] == ["code"]
    with pytest.raises(DecodeError, match="two domains"):
        bench_prompts(["code"], 1, 42, None, "learned")
    _one_line_error(
        _cli("bench", "--domains", "code", "--router", "learned", *NO_PAIR), "two domains"
    )


def test_decode_checks_the_tree_against_the_vocabulary(tiny_dirs):
    # before: ranks beyond the vocabulary (which run refuses) and --top-k 1000 ended in
    # tracebacks from torch.topk
    pair = tiny_pair_args(tiny_dirs)
    _one_line_error(
        _cli("decode", "hi", "--policy", "static", "--paths", "[(0,), (999,)]", *pair),
        "rank 999",
        "vocabulary",
    )
    _one_line_error(
        _cli("decode", "hi", "--policy", "dynamic", "--top-k", 1000, *pair),
        "top_k 1000",
        "vocabulary",
    )


def test_decode_records_into_a_missing_directory_are_written(tiny_dirs, tmp_path):
    # before: FileNotFoundError after the whole generation; decided: the directories are made
    records = tmp_path / "new" / "dir" / "steps.jsonl"
    result = _cli(
        "decode", "hi", "--max-new-tokens", 3, "--records", records, *tiny_pair_args(tiny_dirs)
    )
    assert result.exit_code == 0, result.output
    assert records.read_text().count("\n") >= 1
    _one_line_error(_cli("decode", "hi", "--records", tmp_path / "steps.txt", *NO_PAIR), ".parquet")


@pytest.mark.parametrize(
    "args",
    [
        ["decode", "--prompt-file", "s3://bucket/p.jsonl"],
        ["export", "policy.json", "--to", "vllm", "-o", "s3://bucket/x.json"],
        [
            "ingest",
            "s3://bucket/log.jsonl",
            "--format",
            "vllm",
            "--prompts",
            "p.jsonl",
            "--out",
            "x",
        ],
        ["llamacpp", "hdfs://head/run"],
    ],
)
def test_a_uri_given_for_a_local_path_is_one_line(tmp_path, monkeypatch, args):
    # before: click folded s3://bucket/p into the local relative path s3:/bucket/p and
    # read or wrote there (or named the mangled path as missing)
    monkeypatch.chdir(tmp_path)
    result = _cli(*args)
    assert result.exit_code == 2, result.output
    assert "not a URI" in result.output and "://" in result.output, result.output
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "option", ["--server-threads", "--per-domain", "--max-new-tokens", "--repeats"]
)
def test_llamacpp_counts_must_be_positive(tmp_path, option):
    result = _cli("llamacpp", tmp_path, option, "0")
    assert result.exit_code == 2 and "Invalid value" in result.output, result.output
