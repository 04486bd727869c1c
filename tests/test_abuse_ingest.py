"""Issue 25, ingest: engine logs that cannot be true are refused line by line, valid JSONL is read
whole, ingested runs are analysed in bounded memory into strict JSON, and every failure of
`ingest` (and of `analyze` on a damaged ingested run) is one `error:` line naming the path.

Cases 10 (impossible counts), 12 (NaN in an ingested run's analysis.json), 14 (JSONL split on
U+2028 and friends; prompt_id 0), 16 (memory of ingest and of the bootstrap) and the tracebacks
of ingest (ENOSPC, --out a file, 10**30, "usage": 5, deep nesting, damaged runs, 0700 modes).
Every log line below is a literal line an engine could have written, or an abuse of one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tracemalloc
from functools import partial

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from specscope.analysis import resampling
from specscope.analysis.stats import ClusterBootstrap, ratio
from specscope.analysis.stepwise import analyze_ingested
from specscope.cli import app
from specscope.prompts import sources
from specscope.prompts.items import read_jsonl
from specscope.serving.ingest import IngestError, ingest

PROMPTS = "".join(
    json.dumps({"id": f"p{i}", "domain": "code" if i % 2 else "chat", "prompt": f"question {i}"})
    + "\n"
    for i in range(4)
)

# One plausible line per format (joined to prompt p0), the first line of every bad log below.
GOOD = {
    "vllm": '{"prompt_id": "p0", "response": {"id": "a", "usage": {"completion_tokens": 10}, '
    '"metrics": {"speculative_decoding": {"num_spec_steps": 3, '
    '"num_accepted_draft_tokens": 6, "num_draft_tokens": 6}}}}',
    "sglang": '{"prompt_id": "p0", "response": {"meta_info": {"id": "a", "spec_verify_ct": 3, '
    '"completion_tokens": 10}}}',
    "llama.cpp": '{"prompt_id": "p0", "response": {"id": "a", "timings": {"draft_n": 6, '
    '"draft_n_accepted": 6, "predicted_n": 10, "draft_n_verif_steps": 3}}}',
    "spec-bench": '{"prompt_id": "p0", "response": {"question_id": 0, '
    '"choices": [{"accept_lengths": [3, 3, 3]}]}}',
}


def vllm(steps, accepted, drafted, generated=None, prompt="p1"):
    usage = "" if generated is None else f'"usage": {{"completion_tokens": {generated}}}, '
    return (
        f'{{"prompt_id": "{prompt}", "response": {{"id": "b", {usage}"metrics": '
        f'{{"speculative_decoding": {{"num_spec_steps": {steps}, '
        f'"num_accepted_draft_tokens": {accepted}, "num_draft_tokens": {drafted}}}}}}}}}'
    )


def sglang(steps, generated):
    return (
        f'{{"prompt_id": "p1", "response": {{"meta_info": {{"id": "b", '
        f'"spec_verify_ct": {steps}, "completion_tokens": {generated}}}}}}}'
    )


def llamacpp(drafted, accepted, generated, steps=None):
    verif = "" if steps is None else f', "draft_n_verif_steps": {steps}'
    return (
        f'{{"prompt_id": "p1", "response": {{"id": "b", "timings": {{"draft_n": {drafted}, '
        f'"draft_n_accepted": {accepted}, "predicted_n": {generated}{verif}}}}}}}'
    )


def spec_bench(lengths):
    return (
        f'{{"prompt_id": "p1", "response": {{"question_id": 1, '
        f'"choices": [{{"accept_lengths": {lengths}}}]}}}}'
    )


def _files(tmp_path, fmt, *lines, prompts=PROMPTS):
    (tmp_path / "prompts.jsonl").write_text(prompts, encoding="utf-8")
    (tmp_path / "log.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return tmp_path / "log.jsonl", tmp_path / "prompts.jsonl"


def _ingest_cli(tmp_path, fmt, out=None):
    out = out or tmp_path / "run"
    return CliRunner().invoke(
        app,
        [
            "ingest",
            str(tmp_path / "log.jsonl"),
            "-f",
            fmt,
            "-p",
            str(tmp_path / "prompts.jsonl"),
            "-o",
            str(out),
        ],
    )


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _nothing_written(tmp_path):
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "prompts.jsonl"]


# --- case 10: impossible counts -------------------------------------------------------------------

IMPOSSIBLE = [
    # before: "draft acceptance 10.000"
    ("vllm", vllm(4, 20, 2), r"num_accepted_draft_tokens \(20\) exceeds num_draft_tokens \(2\)"),
    ("vllm", vllm(0, 3, 6), "num_spec_steps is 0 but num_accepted_draft_tokens is 3"),
    # 8 verify steps need 1 + 8 tokens at least, plus all but the last step's accepted drafts
    # (the last may be cut by a stop after vLLM counted them)
    (
        "vllm",
        vllm(8, 5, 24, generated=8),
        r"num_accepted_draft_tokens \+ num_spec_steps "
        r"\(5 \+ 8\) exceeds usage.completion_tokens - 1 \(7\)",
    ),
    (
        "vllm",
        vllm(4, 2, 2**63),
        r"metrics\.speculative_decoding\.num_draft_tokens must be an integer <= "
        r"9223372036854775807, got 9223372036854775808",
    ),
    ("vllm", vllm("true", 0, 3), r"num_spec_steps must be an integer, got True"),
    ("vllm", vllm(-1, 0, 3), "num_spec_steps must be an integer >= 0, got -1"),
    # before: 0 steps and 40 accepted tokens
    # (0 verify steps and 41 tokens is a request served without drafting: accepted, 0 steps)
    (
        "sglang",
        sglang(0, 41).replace(
            '"spec_verify_ct": 0', '"spec_verify_ct": 0, "spec_accept_token_num": 40'
        ),
        "spec_verify_ct is 0 but spec_accept_token_num is 40",
    ),
    ("sglang", sglang(16, 12), r"completion_tokens \(12\) is less than spec_verify_ct \+ 1"),
    # a renamed count is named as the line spells it
    (
        "sglang",
        sglang(3, 9).replace(
            '"spec_verify_ct": 3', '"spec_verify_ct": 3, "spec_accepted_drafts": "5"'
        ),
        r"meta_info\.spec_accepted_drafts must be an integer or none, got '5'",
    ),
    (
        "vllm",
        vllm(3, 2, 6).replace(
            '"num_draft_tokens": 6', '"num_draft_tokens": 6, "per_step_accepted": [0, 1, 1]'
        ),
        r"metrics\.speculative_decoding: per_step_drafted is missing; vLLM's detailed metrics hold",
    ),
    (
        "llama.cpp",
        llamacpp(4, 2, 9).replace('"draft_n_accepted": 2, ', ""),
        r"timings: draft_n_accepted is missing; llama-server writes draft_n and draft_n_accepted",
    ),
    (
        "sglang",
        sglang(2**63, 2**63),
        r"meta_info\.spec_verify_ct must be an integer <= 9223372036854775807, "
        r"got 9223372036854775808",
    ),
    ("sglang", sglang(3, "false"), r"meta_info\.completion_tokens must be an integer, got False"),
    ("llama.cpp", llamacpp(2, 20, 64), r"draft_n_accepted \(20\) exceeds draft_n \(2\)"),
    # before: 1,000 verify steps for 64 tokens, 1.033 tokens per step
    (
        "llama.cpp",
        llamacpp(60, 33, 64, steps=1000),
        r"draft_n_accepted \+ draft_n_verif_steps \(33 \+ 1000\) exceeds predicted_n - 1 \(63\)",
    ),
    (
        "llama.cpp",
        llamacpp(60, 5, 64, steps=0),
        "draft_n_verif_steps is 0 but draft_n_accepted is 5",
    ),
    # (60 drafted, 30 accepted in 10 tokens is possible: llama-server counts a step's accepted
    # drafts before its stop checks, so one step of --spec-draft-n-max 32 can end at any token)
    ("llama.cpp", llamacpp(60, 30, 1), "draft_n is 60 but predicted_n is 1"),
    # before: stored as uint64
    (
        "llama.cpp",
        llamacpp(2**63, 1, 64),
        r"timings\.draft_n must be an integer <= 9223372036854775807, got 9223372036854775808",
    ),
    (
        "spec-bench",
        spec_bench(f"[2, {2**63}]"),
        r"choices\[0\]\.accept_lengths\[1\] must be an integer <= 9223372036854775807, "
        r"got 9223372036854775808",
    ),
    ("spec-bench", spec_bench(f"[{2**62}, {2**62}]"), r"whose sum is at most 2\*\*63 - 1"),
    (
        "spec-bench",
        spec_bench("[true, 2]"),
        r"choices\[0\]\.accept_lengths\[0\] must be an integer, got True",
    ),
]


@pytest.mark.parametrize("fmt,line,rule", IMPOSSIBLE)
def test_impossible_counts_are_refused_naming_file_line_field_and_rule(tmp_path, fmt, line, rule):
    # Before: every one of these lines was ingested and `analyze` reported it (or pyarrow raised
    # a traceback on 2**63).
    log, prompts = _files(tmp_path, fmt, GOOD[fmt], line)
    with pytest.raises(IngestError, match=rule) as caught:
        ingest(log, fmt, prompts, tmp_path / "run")
    assert str(caught.value).startswith(f"{log}:2: ")
    _nothing_written(tmp_path)
    assert f"{log}:2: " in _one_error_line(_ingest_cli(tmp_path, fmt))
    _nothing_written(tmp_path)


def test_counts_at_the_limits_of_the_rules_are_accepted(tmp_path):
    # accepted == drafted, accepted + steps == generated, no steps and nothing accepted
    lines = {
        "vllm": [vllm(3, 6, 6, generated=9), vllm(0, 0, 0, generated=0, prompt="p2")],
        "sglang": [sglang(0, 1)],
        "llama.cpp": [llamacpp(6, 6, 9, steps=3)],
        "spec-bench": [spec_bench("[1, 1]")],
    }
    for fmt, extra in lines.items():
        folder = tmp_path / fmt.replace(".", "")
        folder.mkdir()
        log, prompts = _files(folder, fmt, GOOD[fmt], *extra)
        assert ingest(log, fmt, prompts, folder / "run")["counts"]["requests"] == 1 + len(extra)


# --- case 12: strict JSON -------------------------------------------------------------------------


def _strict(text: str):
    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_analysis_json_of_an_ingested_run_with_boot_0_is_strict_json(tmp_path):
    # Before: "lo": NaN, "hi": NaN, "se": NaN, which strict parsers reject.
    _files(tmp_path, "vllm", GOOD["vllm"], vllm(3, 2, 6, generated=6))
    assert _ingest_cli(tmp_path, "vllm").exit_code == 0
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "run"), "--boot", "0"])
    assert result.exit_code == 0, result.output
    analysis = _strict((tmp_path / "run" / "analysis" / "analysis.json").read_text())
    chat = {d["domain"]: d for d in analysis["domains"]}["chat"]
    assert chat["tokens_per_step"]["value"] == 3.0 and chat["tokens_per_step"]["lo"] is None


# --- case 14: JSONL ----------------------------------------------------------------------------------

SEPARATORS = (
    "a\u2028b\u2029c\u0085d"  # legal raw inside JSON strings; str.splitlines splits on each
)


def test_jsonl_lines_end_at_newline_only(tmp_path):
    # Before: "p0: not valid JSON (Unterminated string ...)" for the prompts and the log alike.
    prompt = json.dumps(
        {"id": "p0", "domain": "chat", "prompt": f"say {SEPARATORS}"}, ensure_ascii=False
    )
    line = GOOD["vllm"].replace('"id": "a"', f'"id": "a", "choices": [{{"text": "{SEPARATORS}"}}]')
    (tmp_path / "prompts.jsonl").write_text(prompt + "\r\n", encoding="utf-8")
    (tmp_path / "log.jsonl").write_text(line + "\r\n", encoding="utf-8")
    assert read_jsonl(tmp_path / "prompts.jsonl")[0].messages[0]["content"] == f"say {SEPARATORS}"
    result = _ingest_cli(tmp_path, "vllm")
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rows["prompt_text"].tolist() == [f"say {SEPARATORS}"]


def test_mtbench_questions_split_on_newline_only(monkeypatch):
    # Before: the question below split in three and the second piece was not JSON.
    data = (
        json.dumps(
            {"question_id": 81, "category": "writing", "turns": [SEPARATORS]}, ensure_ascii=False
        )
        + "\n"
    ).encode()
    monkeypatch.setattr(sources, "_mtbench_from_installed", lambda: data)
    monkeypatch.setattr(sources, "MTBENCH_SHA256", hashlib.sha256(data).hexdigest())
    assert sources.mtbench_questions()[0].turns == (SEPARATORS,)


def test_prompt_id_0_is_honoured(tmp_path):
    # Before: `prompt_id: 0` was falsy and the line joined prompt "b" (its request id), silently.
    prompts = (
        json.dumps({"id": 0, "domain": "math", "prompt": "zero"})
        + "\n"
        + json.dumps({"id": "b", "domain": "chat", "prompt": "bee"})
        + "\n"
    )
    line = vllm(3, 2, 6).replace('"prompt_id": "p1"', '"prompt_id": 0')
    log, prompts_file = _files(tmp_path, "vllm", line, prompts=prompts)
    ingest(log, "vllm", prompts_file, tmp_path / "run")
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rows[["prompt_id", "domain", "request_id"]].values.tolist() == [["0", "math", "b"]]


# --- case 16: bounded memory -------------------------------------------------------------------------


def _requests(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "prompt_id": [f"q{i}" for i in range(n)],
            "domain": np.array(["chat", "code", "math", "reasoning"])[np.arange(n) % 4],
            "steps": np.full(n, 30),
            "accepted": rng.binomial(90, 0.5, n),
            "drafted": np.full(n, 90),
        }
    )


def test_chunked_bootstrap_gives_the_figures_of_the_whole_weight_matrix(monkeypatch):
    # The same seed gives the same figures as before, drawn a few weights at a time.
    requests = _requests(41, seed=3)
    requests.loc[requests["domain"] == "math", "drafted"] = np.nan  # not logged there
    monkeypatch.setattr(resampling, "CHUNK_WEIGHTS", 7)
    got = {d.domain: d for d in analyze_ingested({}, requests, n_boot=50, seed=9).domains}
    ordered = requests.sort_values(["domain", "prompt_id"], kind="stable")
    boot = ClusterBootstrap.draw(ordered["domain"].to_numpy(), 50, 9)
    for domain, d in got.items():
        cols = np.flatnonzero(ordered["domain"].to_numpy() == domain)
        sub = boot.subset(cols)
        s, a = (
            sub.total(ordered["steps"].to_numpy(float)[cols]),
            sub.total(ordered["accepted"].to_numpy(float)[cols]),
        )
        assert d.tokens_per_step == sub.estimate(ratio(a + s, s), prompts=len(cols))
        assert d.accepted_per_step == sub.estimate(ratio(a, s), prompts=len(cols))
        if domain == "math":
            assert d.draft_acceptance is None
        else:
            drafted = sub.total(ordered["drafted"].to_numpy(float)[cols])
            assert d.draft_acceptance == sub.estimate(ratio(a, drafted), prompts=len(cols))


def _peak_mb(work) -> float:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_bootstrap_memory_does_not_grow_with_the_requests():
    # Before: (B + 1) x requests float64 weights (and an int64 copy per domain): 106 MiB more than
    # without resamples at 200,000 requests and 50 resamples; 7.5 GiB for 10^6 requests and 1000.
    # What remains is the requests' own columns (the peak without resamples).
    for n in (20_000, 200_000):
        requests = _requests(n)
        columns = _peak_mb(partial(analyze_ingested, {}, requests, n_boot=0, seed=0))
        peak = _peak_mb(partial(analyze_ingested, {}, requests, n_boot=50, seed=0))
        assert peak - columns < 20, (
            f"{n} requests: {peak:.0f} MiB, {columns:.0f} MiB without resamples"
        )


def test_ingest_memory_does_not_grow_with_the_log(tmp_path):
    # Before: the whole log as text, then its lines, then every line's stats: 61 MiB here.
    text = "x" * 10_000  # llama-server and vLLM log each response's text with its stats
    prompts = "".join(
        json.dumps({"id": f"p{i}", "domain": "chat", "prompt": "q"}) + "\n" for i in range(3000)
    )
    lines = [
        vllm(3, 2, 6, prompt=f"p{i}").replace('"id": "b"', f'"id": "b", "text": "{text}"')
        for i in range(3000)
    ]
    log, prompts_file = _files(tmp_path, "vllm", *lines, prompts=prompts)
    assert log.stat().st_size > 30e6
    peak = _peak_mb(lambda: ingest(log, "vllm", prompts_file, tmp_path / "run"))
    assert peak < 10, f"peak {peak:.0f} MiB"
    assert len(pd.read_parquet(tmp_path / "run" / "requests.parquet")) == 3000


# --- tracebacks before: one error line now --------------------------------------------------------


def test_a_full_disk_during_ingest_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    _files(tmp_path, "vllm", GOOD["vllm"])
    line = _one_error_line(_ingest_cli(tmp_path, "vllm"))
    assert str(tmp_path / "run") in line and "No space left on device" in line
    _nothing_written(tmp_path)


def test_out_an_existing_file_is_refused_and_kept(tmp_path):
    # Before: NotADirectoryError, after the whole log had been read.
    _files(tmp_path, "vllm", GOOD["vllm"])
    (tmp_path / "run").write_text("mine\n")
    line = _one_error_line(_ingest_cli(tmp_path, "vllm"))
    assert f"--out {tmp_path / 'run'} is a file" in line
    assert (tmp_path / "run").read_text() == "mine\n"


@pytest.mark.parametrize(
    "line,message",
    [
        # before: OverflowError from pyarrow (a traceback)
        (
            vllm(3, 2, 10**30),
            r"num_draft_tokens must be an integer <= 9223372036854775807, "
            r"got 1000000000000000000000000000000",
        ),
        # before: AttributeError: 'int' object has no attribute 'get'
        (
            vllm(3, 2, 6).replace('"id": "b", ', '"id": "b", "usage": 5, '),
            r"usage must be a table \(an object\) or none, got 5",
        ),
        (
            vllm(3, 2, 6).replace(
                '"id": "b", ', '"id": "b", "usage": {"completion_tokens": "9"}, '
            ),
            r"usage\.completion_tokens must be an integer or none, got '9'",
        ),
        (
            vllm(3, 2, 6).replace(
                '"response": {"id": "b", "metrics": {',
                '"response": {"id": "b", "metrics": 5, "x": {',
            ),
            "no metrics.speculative_decoding",
        ),
        (
            vllm(3, 2, 6).replace('"prompt_id": "p1"', '"prompt_id": ["p1"]'),
            r"prompt_id must be a string or an integer, got \['p1'\]",
        ),
        # before: RecursionError (no path, no line)
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
        # before: ValueError: Exceeds the limit (4300 digits) for integer string conversion
        (vllm(3, 2, "9" * 5000), "not usable JSON"),
        (b"\xff\xfe{}".decode("latin-1"), "not valid JSON"),
    ],
)
def test_bad_fields_and_lines_are_one_line_naming_the_line(tmp_path, line, message):
    # a good line after the bad one: only a torn last line is skipped (see below)
    log, _ = _files(tmp_path, "vllm", GOOD["vllm"], line, vllm(3, 2, 6, prompt="p2"))
    error = _one_error_line(_ingest_cli(tmp_path, "vllm"))
    assert f"{log}:2: " in error
    assert re.search(message, error), error
    _nothing_written(tmp_path)


def test_ingested_run_dir_modes_follow_the_umask(tmp_path):
    # Before: 0700 (mkdtemp's mode), whatever the umask.
    log, prompts = _files(tmp_path, "vllm", GOOD["vllm"])
    old = os.umask(0o022)
    try:
        ingest(log, "vllm", prompts, tmp_path / "run")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o755
    for name in ("manifest.json", "requests.parquet"):
        assert stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) == 0o644


def _damage_missing(run):
    (run / "requests.parquet").unlink()


def _damage_truncated(run):
    data = (run / "requests.parquet").read_bytes()
    (run / "requests.parquet").write_bytes(data[: len(data) // 2])


def _damage_column(run):
    pd.read_parquet(run / "requests.parquet").drop(columns=["accepted"]).to_parquet(
        run / "requests.parquet"
    )


def _damage_type(run):
    frame = pd.read_parquet(run / "requests.parquet")
    frame["steps"] = "many"
    frame.to_parquet(run / "requests.parquet")


@pytest.mark.parametrize(
    "damage,message",
    [
        (_damage_missing, "requests.parquet is missing"),  # before: FileNotFoundError traceback
        (_damage_truncated, "requests.parquet is damaged"),  # before: ArrowInvalid traceback
        (_damage_column, "requests.parquet has no column 'accepted'"),  # before: KeyError
        (_damage_type, "column 'steps' is not numeric"),  # before: ValueError in numpy
    ],
)
def test_analyze_of_a_damaged_ingested_run_is_one_line(tmp_path, damage, message):
    _files(tmp_path, "vllm", GOOD["vllm"])
    assert _ingest_cli(tmp_path, "vllm").exit_code == 0
    damage(tmp_path / "run")
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "run"), "--boot", "10"])
    line = _one_error_line(result)
    assert str(tmp_path / "run") in line and message in line


def test_tables_md_of_an_ingested_run_escapes_domain_names(tmp_path):
    # Before: the ingested run's tables.md wrote a domain named with HTML as raw HTML.
    hostile = "<img src=x onerror=alert(1)>"
    prompts = json.dumps({"id": "p0", "domain": hostile, "prompt": "question 0"}) + "\n"
    _files(tmp_path, "vllm", GOOD["vllm"], prompts=prompts)
    assert _ingest_cli(tmp_path, "vllm").exit_code == 0
    result = CliRunner().invoke(
        app, ["analyze", str(tmp_path / "run"), "--boot", "0", "--show", "none"]
    )
    assert result.exit_code == 0, result.output
    tables = (tmp_path / "run" / "analysis" / "tables.md").read_text()
    assert hostile not in tables and "&lt;img" in tables


# --- issue 37: logs that keep what they can (review cases 50, 87, 96, 98) ---------------------------


def _gateway(prompt, response, **fields):
    """A line of the gateway's request log (``response``) or errors log (no response)."""
    entry = {
        "prompt_id": prompt,
        "domain": "code",
        "backend": "http://127.0.0.1:8081",
        "model": "code",
        "path": "/v1/chat/completions",
    }
    return json.dumps(entry | fields | ({"response": response} if response else {}))


def _read_back(tmp_path):
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    return rows["prompt_id"].tolist(), manifest


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path):
    # Before (case 87): "...:31: not valid JSON", the 30 good records unusable. The gateway on a
    # full disk (or killed mid-write) leaves its last record cut short, with no newline.
    torn = vllm(3, 2, 6, prompt="p2")[:57]
    log, _ = _files(tmp_path, "vllm", GOOD["vllm"], vllm(3, 2, 6))
    with log.open("a") as f:
        f.write(torn)
    result = _ingest_cli(tmp_path, "vllm")
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"warning: {log}:3: the last line is not valid JSON and was skipped (a line cut short "
        "when its writer was killed or the disk filled)\n"
    )
    prompt_ids, manifest = _read_back(tmp_path)
    assert prompt_ids == ["p0", "p1"]
    assert manifest["skipped"] == {"torn_last_line": f"{log}:3", "without_statistics": 0}
    assert manifest["counts"]["requests"] == 2


def test_a_last_line_cut_inside_a_character_and_blank_lines_after_it_are_a_torn_line(tmp_path):
    line = vllm(3, 2, 6).replace('"id": "b"', '"id": "b", "text": "日本"')
    log, prompts = _files(tmp_path, "vllm", GOOD["vllm"])
    with log.open("ab") as f:
        f.write(line.encode()[: line.encode().index("日".encode()) + 2] + b"\n\n")
    manifest = ingest(log, "vllm", prompts, tmp_path / "run")
    assert manifest["skipped"]["torn_last_line"] == f"{log}:2"
    assert manifest["counts"]["requests"] == 1


@pytest.mark.parametrize(
    "bad,message",
    [
        # a torn line in the middle: the file is damaged, not cut short at the end
        (vllm(3, 2, 6)[:57], r"not valid JSON"),
        # valid JSON, but no record (in the middle or at the end)
        ('{"prompt_id": "p1"}', r"no metrics.speculative_decoding"),
    ],
)
def test_a_torn_middle_line_or_an_incomplete_record_refuses_the_log(tmp_path, bad, message):
    for lines in ((GOOD["vllm"], bad, vllm(3, 2, 6, prompt="p2")), (GOOD["vllm"], bad)):
        if "not valid JSON" in message and len(lines) == 2:
            continue  # that one is the torn last line above
        log, _ = _files(tmp_path, "vllm", *lines)
        error = _one_error_line(_ingest_cli(tmp_path, "vllm"))
        assert error.startswith(f"error: {log}:2: ") and re.search(message, error), error
        _nothing_written(tmp_path)


ERRORS_LOG = [
    _gateway("p1", None, status=502, error="backend code for domain 'code' is unreachable"),
    _gateway("p2", None, status=500, body='{"error": "oops"}'),
    _gateway("p3", None, stream=True, status=200, error="the stream ended early"),
]


def test_the_gateways_errors_log_is_named_as_such(tmp_path):
    # Before (case 96): "...:1: no timings".
    log, _ = _files(tmp_path, "llama.cpp", *ERRORS_LOG)
    error = _one_error_line(_ingest_cli(tmp_path, "llama.cpp"))
    assert error == (
        f"error: {log}:1: this line is a failed request (status 502) as the gateway's errors "
        "log records them (fields 'error'/'status', no 'response'), not an answer with "
        "statistics: ingest the gateway's request log (the --log file, not X.errors.jsonl)"
    )
    _nothing_written(tmp_path)
    # case 98: the request log and the errors log in one file
    log, _ = _files(tmp_path, "llama.cpp", GOOD["llama.cpp"], *ERRORS_LOG[1:])
    error = _one_error_line(_ingest_cli(tmp_path, "llama.cpp"))
    assert error.startswith(f"error: {log}:2: this line is a failed request (status 500) as ")
    _nothing_written(tmp_path)


def _stream_final(prompt, timings=None):
    """The gateway's record of a streamed answer: its last event, which carries llama-server's
    ``timings`` if given (and no statistics of any engine if not)."""
    chunk = {
        "id": f"chatcmpl-{prompt}",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    return _gateway(prompt, chunk | ({"timings": timings} if timings else {}), stream=True)


@pytest.mark.parametrize(
    "fmt,hint",
    [
        (
            "vllm",
            "no metrics; vLLM sends metrics only in the final usage chunk: set "
            "stream_options.include_usage: true or start vLLM with "
            "--enable-force-include-usage",
        ),
        (
            "llama.cpp",
            "no timings; llama-server sends timings in the final chunk (stop: true or a "
            "finish_reason)",
        ),
    ],
)
def test_streamed_answers_without_statistics_are_skipped_and_counted(tmp_path, fmt, hint):
    # Before (case 50): the gateway logged them in the request log and ingest refused the log
    # ("no timings"); a vLLM log ended in "the stream ... ends without its final chunk".
    unstated = [_stream_final(f"p{i}") for i in (1, 2, 3)]
    log, _ = _files(tmp_path, fmt, unstated[0], GOOD[fmt], *unstated[1:])
    result = _ingest_cli(tmp_path, fmt)
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"warning: 3 line(s) without statistics skipped ({log}:1, {log}:3, {log}:4): streamed "
        f"answers whose events carried {hint}\n"
    )
    prompt_ids, manifest = _read_back(tmp_path)
    assert prompt_ids == ["p0"]
    assert manifest["skipped"] == {"torn_last_line": None, "without_statistics": 3}
    assert manifest["warnings"] == [result.stderr[len("warning: ") : -1]]
    # a log of nothing else holds no requests, and says why
    shutil.rmtree(tmp_path / "run")
    _files(tmp_path, fmt, *unstated)
    error = _one_error_line(_ingest_cli(tmp_path, fmt))
    assert error == (
        f"error: {log} holds no requests: 3 line(s) without statistics skipped ({log}:1, "
        f"{log}:2, {log}:3): streamed answers whose events carried {hint}"
    )
    _nothing_written(tmp_path)


def test_a_streamed_answer_with_statistics_is_read_and_more_than_three_skipped_are_counted(
    tmp_path,
):
    timings = {"predicted_n": 10, "draft_n": 6, "draft_n_accepted": 6}  # 3 verify steps
    lines = [_stream_final("p0", timings)] + [_stream_final(f"p{i}") for i in (1, 2, 3, 1, 2)]
    log, prompts = _files(tmp_path, "llama.cpp", *lines)
    manifest = ingest(log, "llama.cpp", prompts, tmp_path / "run")
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert rows[["prompt_id", "steps", "accepted"]].values.tolist() == [["p0", 3, 6]]
    assert manifest["warnings"][0].startswith(
        f"5 line(s) without statistics skipped ({log}:2, {log}:3, {log}:4 and 2 more): "
    )
