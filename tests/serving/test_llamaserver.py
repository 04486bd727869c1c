"""llama.cpp's own programs: llama-bench's JSON (a captured real output), pass-cost curves and
break-even points with exact values, the exact server flags of every spec type, and real
llama-server requests when the programs and the demo pair are on this machine."""

from pathlib import Path

import pandas as pd
import pytest

from specscope.serving.llamacpp.costs import (
    Candidate,
    CostCurve,
    CostGrid,
    break_even_rows,
    candidates,
    curves_from_bench,
)
from specscope.serving.llamacpp.programs import (
    BenchGrid,
    LlamaTools,
    LlamaToolsError,
    parse_llama_bench,
)
from specscope.serving.llamacpp.server import Completion, ServerSetting

DATA = Path(__file__).parents[1] / "data"


def curve(role, quant, threads, poll, seconds, depth=192):
    return CostCurve(
        role,
        quant,
        f"{role}.gguf",
        threads,
        poll,
        2048,
        512,
        depth,
        tuple(enumerate(seconds, start=1)),
        tuple((n, 0.0) for n in range(1, len(seconds) + 1)),
    )


# a target whose 2-token pass costs 1.35x a one-token pass, and a cheap draft
TARGET = curve("target", "Q4_K_M", 2, 0, [0.040, 0.054, 0.070, 0.088, 0.112])
DRAFT = curve("draft", "Q4_K_M", 2, 0, [0.012, 0.016, 0.020, 0.024, 0.028])
# the same pair with busy polling: a one-token target pass 5% cheaper, every other pass dearer
TARGET50 = curve("target", "Q4_K_M", 2, 50, [0.038, 0.060, 0.077, 0.097, 0.123])
DRAFT50 = curve("draft", "Q4_K_M", 2, 50, [0.018, 0.024, 0.030, 0.036, 0.042])


def test_llama_bench_json_is_parsed_into_curves():
    rows = parse_llama_bench((DATA / "llama_bench.json").read_text())
    assert [r.n_prompt for r in rows] == [1, 2, 3]
    assert all(r.n_gen == 0 and r.n_depth == 16 and r.n_threads == 1 and r.poll == 0 for r in rows)
    assert all(len(r.samples_ns) == 2 for r in rows)
    assert rows[0].seconds == pytest.approx(rows[0].avg_ns / 1e9)
    [c] = curves_from_bench(rows, "draft", "Q4_K_M")
    assert [n for n, _ in c.seconds] == [1, 2, 3] and c.depth == 16 and c.threads == 1
    assert c.relative(1) == 1.0 and c.at(2) == pytest.approx(rows[1].avg_ns / 1e9)


def test_llama_bench_output_that_is_not_a_test_array_is_named():
    with pytest.raises(LlamaToolsError, match="no JSON array"):
        parse_llama_bench("main: error: failed to load model")
    with pytest.raises(LlamaToolsError, match="field 'avg_ns'"):
        parse_llama_bench(
            '[{"model_filename": "m.gguf", "n_prompt": 1, "n_gen": 0, '
            '"n_threads": 2, "n_batch": 1, "n_ubatch": 1}]'
        )


def test_bench_grid_argv_crosses_every_axis():
    tools = LlamaTools(Path("/bin"), "0")
    grid = BenchGrid(
        threads=(1, 2), polls=(0, 50), tokens=(1, 2, 3), depths=(0, 192), repetitions=3
    )
    argv = grid.argv(tools, "m.gguf")
    assert argv[:3] == ["/bin/llama-bench", "-m", "m.gguf"]
    assert argv[argv.index("-p") + 1] == "1,2,3" and argv[argv.index("-t") + 1] == "1,2"
    assert argv[argv.index("--poll") + 1] == "0,50" and argv[argv.index("-d") + 1] == "0,192"
    assert argv[-2:] == ["-o", "json"] and grid.tests == 2 * 2 * 3 * 2


def test_server_flags_are_exact_and_complete():
    plain = ServerSetting()
    assert plain.flags() == [
        "-t",
        "2",
        "-tb",
        "2",
        "--poll",
        "50",
        "-b",
        "2048",
        "-ub",
        "512",
        "-c",
        "4096",
        "-np",
        "1",
        "-ngl",
        "0",
    ]
    spec = ServerSetting(poll=0, k=3, draft_threads=1, draft_poll=0)
    assert spec.flags("d.gguf")[16:] == [
        "-md",
        "d.gguf",
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "3",
        "--spec-draft-n-min",
        "0",
        "--spec-draft-p-min",
        "0",
        "-td",
        "1",
        "-tbd",
        "1",
        "--spec-draft-poll",
        "0",
        "--spec-draft-ngl",
        "0",
    ]
    assert spec.name == "k3-td1-dpoll0-t2-poll0-b2048-ub512"
    assert ServerSetting.from_dict(spec.to_dict()) == spec


def test_break_even_from_curves():
    cand = Candidate(ServerSetting(poll=0, draft_threads=2, draft_poll=0), TARGET, DRAFT)
    c = cand.costs()
    assert c.plain_token_s == pytest.approx(0.040)
    # K = 1: the draft's pass of the last token, the target's pass of 2 and the draft's pass of
    # the same 2 again must be paid by tau tokens of 40 ms
    assert c.break_even_tau(1) == pytest.approx((0.012 + 0.054 + 0.016) / 0.040)  # 2.05 > 2
    assert c.break_even_tau(3) == pytest.approx((3 * 0.012 + 0.088 + 0.024) / 0.040)  # 3.7
    assert c.break_even_tau(4) == pytest.approx((4 * 0.012 + 0.112 + 0.028) / 0.040)  # 4.7 < 5
    # perfect acceptance with K = 1 pays while d + (16 / 12) d + 0.054 < 2 * 0.040
    assert c.break_even_draft_s(1) == pytest.approx((0.080 - 0.054) / (1 + 0.016 / 0.012))
    table = pd.DataFrame(break_even_rows(CostGrid((TARGET, DRAFT)).candidates(), [1, 4]))
    assert list(table["break_even_tau"]) == pytest.approx([2.05, 4.7])
    assert list(table["pays_at_all"]) == [False, True]
    assert list(table["target_k1_rel"]) == pytest.approx([1.35, 2.8])
    # a target whose passes grow linearly never pays, whatever the acceptance
    linear = curve("target", "Q8_0", 2, 0, [0.04, 0.08, 0.12, 0.16, 0.20])
    lin = pd.DataFrame(break_even_rows(CostGrid((linear, DRAFT)).candidates(), [1, 2, 3, 4]))
    assert not any(lin["pays_at_all"])


def test_grid_candidates_pair_each_target_with_its_drafts():
    options = candidates([TARGET, DRAFT, TARGET50, DRAFT50])
    # two plain settings (poll 0 and 50), each with its own draft curve
    assert sorted(c.name for c in options) == [
        "Q4_K_M+Q4_K_M t2-poll0-b2048-ub512 td2",
        "Q4_K_M+Q4_K_M t2-poll50-b2048-ub512 td2",
        "plain Q4_K_M t2-poll0-b2048-ub512",
        "plain Q4_K_M t2-poll50-b2048-ub512",
    ]


def test_the_pinned_llama_cpp_source_is_checked_before_it_is_built(tmp_path, monkeypatch):
    """No llama-cpp-python is needed: the build's source is pinned, it is looked for in the cache
    under the sdist's version, and an archive whose sha256 is not the pinned one is refused
    before anything is extracted or compiled."""
    import io
    import tarfile

    from specscope.serving.llamacpp import programs

    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(programs.BIN_ENV, raising=False)
    assert programs.LLAMA_SOURCE.build == "b11312" and programs.LLAMA_SOURCE.version == "0.3.36"
    assert programs.build_root() == tmp_path / "cache" / "llama.cpp" / "0.3.36"
    assert programs.find_llama_tools() is None  # nothing built there yet
    monkeypatch.setattr(programs, "_require_build_tools", lambda: None)
    ran = []

    def fake_pip(cmd, log, echo, what, cwd=None):  # a tampered archive where pip would save it
        ran.append(what)
        assert programs.LLAMA_SOURCE.requirement in cmd
        fake = io.BytesIO()
        with tarfile.open(fileobj=fake, mode="w:gz") as tar:
            data = b"cmake_minimum_required(VERSION 3.14)\n"
            info = tarfile.TarInfo("llama_cpp_python-0.3.36/vendor/llama.cpp/CMakeLists.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        (Path(cmd[cmd.index("-d") + 1]) / "llama_cpp_python-0.3.36.tar.gz").write_bytes(
            fake.getvalue()
        )

    monkeypatch.setattr(programs, "_run_logged", fake_pip)
    with pytest.raises(LlamaToolsError, match="not the pinned"):
        programs.build_llama_tools(echo=lambda line: None)
    assert ran == ["pip download"]  # neither cmake step ran
    assert not (programs.build_root() / "llama_cpp_python-0.3.36").exists()


def test_completion_without_drafts_counts_zero():
    done = Completion.from_response(
        {
            "content": "x",
            "tokens": [1, 2],
            "stop_type": "limit",
            "timings": {
                "predicted_n": 2,
                "predicted_ms": 50.0,
                "predicted_per_second": 40.0,
                "prompt_n": 5,
                "prompt_ms": 20.0,
            },
        }
    )
    assert done.draft_n == 0 and done.draft_n_accepted == 0 and done.tokens == [1, 2]


def _demo_or_skip():
    from conftest import llama_tools
    from specscope.models.demo import _kept_gguf

    tools = llama_tools()
    draft = _kept_gguf("draft")
    if not draft.is_file():
        pytest.skip(
            f"the demo draft GGUF is not assembled at {draft} (specscope.models.demo."
            "demo_gguf('draft') assembles it from the demo extra's part packages)"
        )
    return tools, draft


@pytest.mark.weights
@pytest.mark.llamacpp
def test_llama_server_speculates_with_a_model_as_its_own_draft():
    from specscope.serving.llamacpp.server import LlamaServer

    tools, gguf = _demo_or_skip()
    ids = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    with LlamaServer(tools, gguf, ServerSetting(threads=1, poll=0)) as plain:
        base = plain.complete(ids, 8)
    with LlamaServer(
        tools, gguf, ServerSetting(threads=1, poll=0, k=2, draft_poll=0), draft=gguf
    ) as spec:
        out = spec.complete(ids, 8)
    assert base.predicted_n == out.predicted_n == 8 and base.draft_n == 0
    assert out.draft_n > 0 and out.draft_n_accepted >= out.draft_n // 2
    assert out.tokens[:4] == base.tokens[:4] and out.predicted_per_second > 0


def test_lookup_chain_counts_by_hand():
    from lab.llama_router import lookup_chain_counts

    # a lookup that always drafts [7, 8, 9]; the output after the prompt's token 5 is 7 8 1 ...
    output = [5, 7, 8, 1, 7, 8, 9, 2]
    counts = lookup_chain_counts([3, 4], output, lambda context, k: [7, 8, 9][:k], 3)
    # t=1: drafts 7 8 9, accepts 7 8 (then 1 differs): emits 7 8 1 -> t=4
    # t=4: drafts 7 8 9, all accepted: emits 7 8 9 2 -> t=8, the end
    assert (counts.drafted, counts.accepted, counts.steps) == (6, 5, 2)
    assert counts.tokens_per_step == (5 + 2) / 2
    # the cap: at most n_predict - t - 1 drafts; no draft with one token left
    counts = lookup_chain_counts([3], [5, 7, 8], lambda context, k: [7, 8, 9][:k], 3)
    assert (counts.drafted, counts.accepted, counts.steps) == (1, 1, 1)


@pytest.mark.weights
@pytest.mark.llamacpp
@pytest.mark.parametrize("ngram_size, m", [(3, 8), (12, 48)])
def test_llama_ngram_simple_replays_llama_servers_own_counters(ngram_size, m):
    """llama-server's ngram-simple on the demo draft GGUF (as the target): its draft_n and
    draft_n_accepted on each request equal what specscope's llama-ngram-simple drafter drafts and
    accepts along the same prompt and output tokens, exactly."""
    from lab.llama_router import lookup_chain_counts
    from specscope.drafters import DrafterConfig, lookup_for
    from specscope.serving.llamacpp.server import LlamaServer

    tools, gguf = _demo_or_skip()
    code = (
        "def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
        "def volume(width, height, depth):\n    return width * height * depth\n"
    )
    texts = [
        f"Copy this code exactly, twice.\n\n{code}\nFirst copy:\n{code}\nSecond copy:\n",
        "Count: one two three four five six seven eight nine ten, one two three four five",
    ]
    lookup = lookup_for(DrafterConfig("llama-ngram-simple", ngram_size=ngram_size))
    setting = ServerSetting(threads=2, poll=0, k=m, spec_type="ngram-simple", ngram_size=ngram_size)
    drafted = 0
    with LlamaServer(tools, gguf, setting) as server:
        for text in texts:
            ids = server.tokenize(text)
            out = server.complete(ids, 64)
            counts = lookup_chain_counts(ids, out.tokens, lookup, m, n_predict=64)
            assert (out.draft_n, out.draft_n_accepted) == (counts.drafted, counts.accepted), text
            drafted += out.draft_n
    assert drafted > 0, "the prompts should make llama-server draft"
