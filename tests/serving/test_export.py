"""specscope export: each engine version's settings as literal expected outputs.

Every expected output cites the engine file and commit whose rules it reproduces:
- llama.cpp b11312 = ggml-org/llama.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f (vendored by
  llama-cpp-python 0.3.36): common/arg.cpp (flag names, n_max >= 0), common/preset.cpp (INI keys =
  flag names without dashes), tools/server/server-schema.cpp (request fields under #if 0).
- vLLM main@002e77c1 = vllm-project/vllm vllm/config/speculative.py@002e77c1f0ef (fields, extra
  keys forbidden, no speculative_token_tree).
- SGLang 0.5.23 = sgl-project/sglang v0.5.23 as its PyPI wheel ships it:
  python/sglang/srt/arg_groups/fields/spec.py (flags), arg_groups/speculative_hook.py (topk 1:
  num_draft_tokens = steps + 1) and speculative/eagle_utils.py organize_draft_results (node
  budget); main@469c63e5 = python/sglang/srt/server_args.py@469c63e54e7d (as recorded before).
- TensorRT-LLM main@00043967 = NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py@000439672005
  (DraftTargetDecodingConfig: decoding_type Draft_Target, max_draft_len > 0, speculative_model).
- transformers 5.23.0: src/transformers/generation/candidate_generator.py@v5.23.0 (the assistant's
  generation_config is read; test_export_transformers.py runs it).
"""

import itertools
import json

import pytest
from typer.testing import CliRunner

from specscope.cli import app
from specscope.serving.export import (
    ENGINES,
    ExportError,
    ExportOptions,
    engines_table,
    export_policy,
)
from specscope.trees import TreeShape
from specscope.tune.costs import CostModel
from specscope.tune.policy import PolicyFile

CHAIN3 = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
TREE = TreeShape.from_paths([(0,), (1,), (0, 0)])
CHAIN2 = TreeShape.from_paths([(0,), (0, 0)])
BINARY3 = TreeShape.from_paths([p for d in (1, 2, 3) for p in itertools.product((0, 1), repeat=d)])
DRAFT = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
GGUF = ExportOptions(draft="/m/draft.gguf", target="/m/target.gguf")


def _policy(math=TREE, **info) -> PolicyFile:
    return PolicyFile(trees={"code": CHAIN3, "math": math, "chat": None}, uniform=CHAIN2, info=info)


# --- registry ----------------------------------------------------------------------------------


def test_every_document_names_its_engine_version_and_sources():
    doc = export_policy(_policy(math=CHAIN2), "llama.cpp", GGUF)
    assert doc["engine_version"] == "b11312"
    assert doc["checked_against"][0] == (
        "ggml-org/llama.cpp:common/arg.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    )
    assert doc["approximation"] is None
    # every domain the router produces is deployed; reasoning is not in the policy: uniform tree
    assert {d: (s["tree"], s["source"]) for d, s in doc["domains"].items()} == {
        "code": ("[(0,), (0, 0), (0, 0, 0)]", "policy"),
        "math": ("[(0,), (0, 0)]", "policy"),
        "reasoning": ("[(0,), (0, 0)]", "uniform"),
        "chat": ("none", "policy"),
    }
    for engine in ENGINES.values():
        for version in engine.versions:
            assert version.checked_against and all("@" in s for s in version.checked_against)


def test_unknown_engine_version_lists_the_checked_ones():
    with pytest.raises(
        ExportError,
        match=r"^vllm version '0.9.0' was not checked; checked: "
        r"main@002e77c1, main@f19b16d9 \(--engine-version\)$",
    ):
        export_policy(
            _policy(math=CHAIN2), "vllm", ExportOptions(draft=DRAFT), engine_version="0.9.0"
        )


def test_policy_domain_the_router_cannot_produce_is_refused():
    policy = PolicyFile(trees={"code": CHAIN3, "mtbench-math": CHAIN2})
    with pytest.raises(
        ExportError,
        match=r"^policy domain 'mtbench-math' is not one the router "
        r"produces; allowed: code, math, reasoning, chat",
    ):
        export_policy(policy, "llama.cpp", GGUF)


def test_engines_page_table_is_the_registry():
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs/reference/engines.md").read_text()
    assert engines_table() in page


# --- llama.cpp b11312 ------------------------------------------------------------------------


def test_llamacpp_b11312_flags_and_presets():
    doc = export_policy(_policy(math=CHAIN2), "llama.cpp", GGUF, source="policy.json")
    code = doc["domains"]["code"]
    assert code["flags"] == {
        "--model": "/m/target.gguf",
        "--spec-type": "draft-simple",
        "--spec-draft-model": "/m/draft.gguf",
        "--spec-draft-n-max": 3,
        "--spec-draft-n-min": 0,
        "--spec-draft-p-min": 0.0,
        "--poll": 0,
        "--spec-draft-poll": 0,
    }
    assert code["server_args"] == [
        "llama-server",
        "--model",
        "/m/target.gguf",
        "--spec-type",
        "draft-simple",
        "--spec-draft-model",
        "/m/draft.gguf",
        "--spec-draft-n-max",
        "3",
        "--spec-draft-n-min",
        "0",
        "--spec-draft-p-min",
        "0.0",
        "--poll",
        "0",
        "--spec-draft-poll",
        "0",
    ]
    assert doc["domains"]["chat"]["flags"] == {"--model": "/m/target.gguf"}  # plain decoding
    assert doc["router_args"] == ["llama-server", "--models-preset", "presets.ini"]
    assert (
        doc["presets_ini"]
        == """\
; specscope export for llama-server router mode (llama.cpp b11312)
; policy: policy.json
; start: llama-server --models-preset THIS_FILE; a request's "model" names its domain

[code]
model = /m/target.gguf
spec-type = draft-simple
spec-draft-model = /m/draft.gguf
spec-draft-n-max = 3
spec-draft-n-min = 0
spec-draft-p-min = 0.0
poll = 0
spec-draft-poll = 0

[math]
model = /m/target.gguf
spec-type = draft-simple
spec-draft-model = /m/draft.gguf
spec-draft-n-max = 2
spec-draft-n-min = 0
spec-draft-p-min = 0.0
poll = 0
spec-draft-poll = 0

[reasoning]
model = /m/target.gguf
spec-type = draft-simple
spec-draft-model = /m/draft.gguf
spec-draft-n-max = 2
spec-draft-n-min = 0
spec-draft-p-min = 0.0
poll = 0
spec-draft-poll = 0

[chat]
model = /m/target.gguf
"""
    )
    assert any("compiled out" in n for n in doc["notes"])


def test_llamacpp_refuses_trees_and_needs_both_ggufs():
    with pytest.raises(
        ExportError,
        match=r"^domain 'math': tree \[\(0,\), \(1,\), \(0, 0\)\] has "
        r"branches, but llama.cpp drafts a chain",
    ):
        export_policy(_policy(), "llama.cpp", GGUF)
    with pytest.raises(
        ExportError,
        match=r"^domain 'code': llama.cpp b11312: breaks the rule no ';', "
        r"'#' or line break in a value",
    ):
        export_policy(
            _policy(math=CHAIN2),
            "llama.cpp",
            ExportOptions(draft="/m/d#1.gguf", target="/m/t.gguf"),
        )
    with pytest.raises(ExportError, match=r"^llama.cpp needs the target GGUF file: pass --target$"):
        export_policy(_policy(math=CHAIN2), "llama.cpp", ExportOptions(draft="/m/d.gguf"))


def test_llamacpp_rules_refuse_what_llama_server_refuses():
    version = ENGINES["llama.cpp"].version("b11312")
    with pytest.raises(ExportError, match=r"refuses field '--draft-max'; allowed: --model"):
        version.validate({"--model": "t.gguf", "--draft-max": 3}, "x")  # removed upstream
    with pytest.raises(ExportError, match=r"--spec-draft-n-max must be >= 0, got -1"):
        version.validate({"--model": "t.gguf", "--spec-draft-n-max": -1}, "x")
    with pytest.raises(
        ExportError,
        match=r"breaks the rule --spec-type draft-simple needs "
        r"--spec-draft-model",
    ):
        version.validate({"--model": "t.gguf", "--spec-type": "draft-simple"}, "x")


# --- vLLM main@002e77c1 ------------------------------------------------------------------------


def test_vllm_main_draft_model_chains():
    doc = export_policy(_policy(math=CHAIN2), "vllm", ExportOptions(draft=DRAFT))
    assert doc["engine_version"] == "main@002e77c1"
    assert doc["domains"]["code"]["speculative_config"] == {
        "method": "draft_model",
        "model": DRAFT,
        "num_speculative_tokens": 3,
    }
    assert doc["domains"]["code"]["serve_args"] == [
        "--speculative-config",
        '{"method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", '
        '"num_speculative_tokens": 3}',
    ]
    assert doc["domains"]["chat"] == {
        "tree": "none",
        "source": "policy",
        "drafter": None,
        "speculative_config": None,
        "serve_args": [],
    }
    assert doc["domains"]["code"]["drafter"] == "draft-model"


def test_vllm_main_refuses_trees_with_the_dated_reason():
    with pytest.raises(
        ExportError,
        match=r"^domain 'math': tree .* has branches, but vLLM \(method "
        r"draft_model\) drafts a chain of top-1 tokens; tune "
        r"chains only .*removed speculative_token_tree \(PR "
        r"#42121, merged 2026-05\)$",
    ):
        export_policy(_policy(), "vllm", ExportOptions(draft=DRAFT))
    version = ENGINES["vllm"].version(None)
    with pytest.raises(ExportError, match="refuses field 'speculative_token_tree'"):
        version.validate(
            {
                "method": "eagle",
                "model": DRAFT,
                "num_speculative_tokens": 3,
                "speculative_token_tree": "[(0,), (1,), (0, 0)]",
            },
            "x",
        )


def test_vllm_writes_no_batch_schedule_for_a_tuned_policy():
    """A policy tuned with a cost model and acceptance vectors gets the domain's K alone: a K per
    batch size would need vLLM's own batched step costs, which specscope does not measure."""
    costs = CostModel(
        draft_s=((1, 0.01), (2, 0.01), (4, 0.02), (8, 0.04), (16, 0.08)),
        target_s=((1, 0.1), (4, 0.1), (8, 0.16), (16, 0.32)),
        plain_token_s=0.1,
    )
    acceptance = {"code": {"rates": [[0.9], [0.8], [0.5]], "counts": [[100], [90], [70]]}}
    policy = _policy(math=CHAIN2, cost_model=costs.to_dict(), acceptance=acceptance)
    doc = export_policy(policy, "vllm", ExportOptions(draft=DRAFT))
    assert doc["domains"]["code"]["speculative_config"] == {
        "method": "draft_model",
        "model": DRAFT,
        "num_speculative_tokens": 3,
    }
    assert doc["approximation"] is None
    assert not any("per_batch_size" in json.dumps(d) for d in doc["domains"].values())
    # the policy records no prediction: its K is not priced, and the entry says so
    assert doc["domains"]["code"]["priced_on"].startswith("not priced: the policy records no ")


def test_vllm_names_what_each_k_was_priced_on():
    """The shipped int8 policy: each domain's K is its chain's length, priced on the tokens per
    step tune replayed for that chain and its cost model (named by its hardware), at batch size
    1; vLLM's own step costs are not claimed."""
    from pathlib import Path

    path = Path(__file__).parents[2] / "results/demo-pair/drafters/decisions/policy.json"
    written = json.loads(path.read_text())
    doc = export_policy(PolicyFile.load(path), "vllm", ExportOptions(draft=DRAFT))
    hardware = written["cost_model"]["hardware"]
    for domain, entry in written["domains"].items():
        setting = doc["domains"][domain]
        k = TreeShape.parse(entry["tree"]).max_depth
        assert setting["speculative_config"]["num_speculative_tokens"] == k
        lo, hi = entry["prediction"]["interval"]
        assert setting["priced_on"] == (
            f"replayed tokens per step {entry['prediction']['tokens_per_step']:.2f} "
            f"[{lo:.2f}, {hi:.2f}] of the policy's tuning runs over its cost model "
            f"(specscope's decoder on one sequence, timed on {hardware}); vLLM's own step costs "
            "and batch sizes above 1 are not priced (no num_speculative_tokens_per_batch_size)"
        )


def test_vllm_f19b16d9_chains():
    # vllm/config/speculative.py@f19b16d95e43: speculative_token_tree still a field
    costs = CostModel(
        draft_s=((1, 0.01), (16, 0.08)), target_s=((1, 0.1), (16, 0.32)), plain_token_s=0.1
    )
    policy = _policy(
        math=CHAIN2,
        cost_model=costs.to_dict(),
        acceptance={"code": {"rates": [[0.9], [0.8], [0.5]], "counts": [[1], [1], [1]]}},
    )
    doc = export_policy(policy, "vllm", ExportOptions(draft=DRAFT), engine_version="main@f19b16d9")
    assert doc["engine_version"] == "main@f19b16d9"
    assert doc["checked_against"] == [
        "vllm-project/vllm:vllm/config/speculative.py@f19b16d95e4395790661f4835e4436bc3dd5d9c7"
    ]
    assert doc["domains"]["code"]["speculative_config"] == {
        "method": "draft_model",
        "model": DRAFT,
        "num_speculative_tokens": 3,
    }
    with pytest.raises(
        ExportError,
        match=r"tune chains only \(specscope tune --max-rank 1\): at "
        r"this version vLLM drafted trees only with an EAGLE head",
    ):
        export_policy(_policy(), "vllm", ExportOptions(draft=DRAFT), engine_version="main@f19b16d9")


# --- SGLang 0.5.23 and main@469c63e5 ------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.23", "main@469c63e5"])
def test_sglang_flags_and_approximation(version):
    doc = export_policy(_policy(), "sglang", ExportOptions(draft=DRAFT), engine_version=version)
    assert doc["engine_version"] == version
    assert doc["domains"]["code"]["serve_args"] == [
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-draft-model-path",
        DRAFT,
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    assert doc["domains"]["code"]["approximated"] is False
    math = doc["domains"]["math"]
    assert math["flags"] == {
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": DRAFT,
        "--speculative-num-steps": 2,
        "--speculative-eagle-topk": 2,
        "--speculative-num-draft-tokens": 4,
    }
    assert math["approximated"] is True
    assert doc["approximation"].startswith(
        "math: SGLang approximates trees: with "
        "--speculative-eagle-topk > 1 it grows a dynamic EAGLE-2"
    )
    chains = export_policy(_policy(math=CHAIN2), "sglang", ExportOptions(draft=DRAFT))
    assert chains["approximation"] is None


@pytest.mark.parametrize("version", ["0.5.23", "main@469c63e5"])
def test_sglang_budget_rule(version):
    # full binary tree of depth 3: 14 nodes, but SGLang scores 2 + 2 * 2^2 = 10 candidates
    with pytest.raises(
        ExportError,
        match=rf"^domain 'math': sglang {version}: breaks the rule "
        r"topk 1: --speculative-num-draft-tokens = steps \+ 1; "
        r"topk > 1: num-draft-tokens - 1 <= topk",
    ):
        export_policy(
            _policy(math=BINARY3), "sglang", ExportOptions(draft=DRAFT), engine_version=version
        )


# --- TensorRT-LLM main@00043967 ----------------------------------------------------------------


def test_trtllm_main_draft_target_chains_without_eagle_choices():
    doc = export_policy(_policy(math=CHAIN2), "trtllm", ExportOptions(draft="/models/draft"))
    assert doc["domains"]["code"]["speculative_config"] == {
        "decoding_type": "Draft_Target",
        "max_draft_len": 3,
        "speculative_model": "/models/draft",
    }
    assert doc["domains"]["chat"]["speculative_config"] is None
    with pytest.raises(
        ExportError,
        match=r"has branches, but TensorRT-LLM \(Draft_Target\) drafts "
        r"a chain.*eagle_choices was removed \(PR #18210\)",
    ):
        export_policy(_policy(), "trtllm", ExportOptions(draft="/models/draft"))
    with pytest.raises(ExportError, match="refuses field 'eagle_choices'"):
        ENGINES["trtllm"].version(None).validate(
            {
                "decoding_type": "Draft_Target",
                "max_draft_len": 2,
                "speculative_model": "d",
                "eagle_choices": [[0], [0, 0]],
            },
            "x",
        )


# --- transformers 5.23.0 -----------------------------------------------------------------------


def test_transformers_assistant_generation_config():
    doc = export_policy(_policy(math=CHAIN2), "transformers", ExportOptions(draft=DRAFT))
    code = doc["domains"]["code"]
    assert code["assistant_generation_config"] == {
        "num_assistant_tokens": 3,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    assert code["snippet"] == (
        "assistant.generation_config.num_assistant_tokens = 3\n"
        "assistant.generation_config.num_assistant_tokens_schedule = 'constant'\n"
        "assistant.generation_config.assistant_confidence_threshold = 0.0\n"
        "outputs = model.generate(**inputs, assistant_model=assistant)"
    )
    assert doc["domains"]["chat"]["assistant_generation_config"] == {}
    with pytest.raises(ExportError, match="transformers drafts a chain"):
        export_policy(_policy(), "transformers", ExportOptions(draft=DRAFT))


# --- command ------------------------------------------------------------------------------------


def test_export_command_writes_json_and_presets(tmp_path):
    policy = tmp_path / "policy.json"
    _policy(math=CHAIN2).save(policy)
    out = tmp_path / "out" / "llamacpp.json"
    result = CliRunner().invoke(
        app,
        [
            "export",
            str(policy),
            "--to",
            "llama.cpp",
            "--draft",
            "/m/draft.gguf",
            "--target",
            "/m/target.gguf",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    ini = out.with_suffix(".ini")
    assert ini.read_text() == doc["presets_ini"]
    assert doc["router_args"] == ["llama-server", "--models-preset", str(ini)]
    assert sorted(p.name for p in out.parent.iterdir()) == ["llamacpp.ini", "llamacpp.json"]
    vllm = tmp_path / "vllm.json"
    result = CliRunner().invoke(
        app,
        [
            "export",
            str(policy),
            "--to",
            "vllm",
            "--draft",
            DRAFT,
            "--engine-version",
            "main@f19b16d9",
            "-o",
            str(vllm),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "(vllm main@f19b16d9)" in result.output
    assert json.loads(vllm.read_text())["engine_version"] == "main@f19b16d9"


def test_bad_exports_are_one_line_errors_and_write_nothing(tmp_path):
    policy = tmp_path / "policy.json"
    _policy().save(policy)
    out = tmp_path / "out" / "x.json"
    runner = CliRunner()
    cases = [
        (["--to", "llama.cpp", "--draft", "d", "--target", "t"], "has branches"),
        (
            ["--to", "tgi"],
            "unknown engine 'tgi'; allowed: vllm, sglang, llama.cpp, trtllm, transformers",
        ),
        (["--to", "sglang"], "sglang needs the draft model it should load: pass --draft"),
        (
            ["--to", "sglang", "--draft", DRAFT, "--engine-version", "0.4"],
            "sglang version '0.4' was not checked; checked: 0.5.23, main@469c63e5",
        ),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["export", str(policy), *args, "--out", str(out)])
        assert result.exit_code == 2 and message in result.output, result.output
        assert not out.parent.exists() or not any(out.parent.iterdir())
    result = runner.invoke(
        app, ["export", str(policy), "--to", "sglang", "--draft", DRAFT, "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "approximation: math: SGLang approximates trees" in result.output
    assert [p.name for p in out.parent.iterdir()] == ["x.json"]  # no temporary left behind
