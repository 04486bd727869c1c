"""specscope export of each drafter (draft model, ngram, early exit) to each engine's own method.

Every expected output cites the engine source it reproduces:
- vLLM main@002e77c1 / main@f19b16d9, vllm/config/speculative.py: method "ngram" with
  prompt_lookup_min/prompt_lookup_max (ge=1), no model (SpeculativeConfig.__post_init__ sets it);
  no early-exit method.
- SGLang 0.5.23 (PyPI wheel), python/sglang/srt/arg_groups/fields/spec.py: --speculative-algorithm
  NGRAM, --speculative-ngram-{min,max}-bfs-breadth, --speculative-ngram-match-type BFS|PROB;
  speculative_hook.py _handle_ngram (topk := max breadth); kernels/jit/csrc/ngram_corpus/trie.cpp
  (a trie shared by all requests: not vLLM's rule).
- llama.cpp b11312 (0c1e57098), common/arg.cpp: --spec-type ngram-simple,
  --spec-ngram-simple-size-n/-m in 1..1024; common/ngram-map.cpp common_ngram_simple_draft (one
  size N, the latest occurrence, no draft shorter than N).
- transformers 5.23.0, generation/utils.py _get_candidate_generator: prompt_lookup_num_tokens,
  max_matching_ngram_size, assistant_early_exit (test_export_transformers.py runs them).
- TensorRT-LLM main@00043967, tensorrt_llm/llmapi/llm_args.py NGramDecodingConfig
  (decoding_type NGram, max_matching_ngram_size, is_keep_all, is_use_oldest, is_public_pool).
"""

import json

import pytest
from typer.testing import CliRunner

from specscope.cli import app
from specscope.drafters import DrafterConfig
from specscope.serving.export import ENGINES, ExportError, ExportOptions, export_policy
from specscope.serving.export_plan import MEASURED_NGRAM
from specscope.trees import TreeShape
from specscope.tune.costs import CostModel
from specscope.tune.policy import PolicyFile

CHAIN3 = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
CHAIN2 = TreeShape.from_paths([(0,), (0, 0)])
DRAFT = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
NGRAM = DrafterConfig("ngram", prompt_lookup_min=2, prompt_lookup_max=4)
EARLY = DrafterConfig("early-exit", exit_layer=8)
OPTIONS = ExportOptions(draft=DRAFT, target="/m/target.gguf")


def _policy(code=NGRAM, math=None, **info) -> PolicyFile:
    """code: a chain of 3 by ``code``; math: a chain of 2 by ``math`` (None: the draft model);
    reasoning: the uniform chain of 2 by the draft model; chat: no speculation."""
    drafters = {"code": code, **({"math": math} if math else {})}
    return PolicyFile(
        trees={"code": CHAIN3, "math": CHAIN2, "chat": None},
        uniform=CHAIN2,
        drafters=drafters,
        info=info,
    )


def test_every_document_names_each_domains_drafter():
    for engine in ENGINES:
        doc = export_policy(_policy(), engine, OPTIONS)
        assert {d: s["drafter"] for d, s in doc["domains"].items()} == {
            "code": "ngram(prompt_lookup_min=2, prompt_lookup_max=4)",
            "math": "draft-model",
            "reasoning": "draft-model",
            "chat": None,
        }, engine


# --- vLLM ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["main@002e77c1", "main@f19b16d9"])
def test_vllm_ngram_is_its_own_method_ngram(version):
    doc = export_policy(_policy(), "vllm", OPTIONS, engine_version=version)
    code = doc["domains"]["code"]
    assert code["speculative_config"] == {
        "method": "ngram",
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
        "num_speculative_tokens": 3,
    }
    assert code["serve_args"] == [
        "--speculative-config",
        '{"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4, '
        '"num_speculative_tokens": 3}',
    ]
    assert doc["domains"]["math"]["speculative_config"] == {
        "method": "draft_model",
        "model": DRAFT,
        "num_speculative_tokens": 2,
    }
    # the V1 runner's proposer is the rule specscope measured; V2 (the default) drafts with
    # another rule, so the export sets the V1 runner and says why
    assert code["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert "env" not in doc["domains"]["math"]
    assert doc["approximation"] is None
    note = next(n for n in doc["notes"] if n.startswith("ngram domains: method ngram"))
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in note and "rightmost occurrence" in note


def test_vllm_gets_no_batch_schedule_for_any_drafter():
    costs = CostModel(
        draft_s=((1, 0.01), (16, 0.08)), target_s=((1, 0.1), (16, 0.32)), plain_token_s=0.1
    )
    rates = {"rates": [[0.9], [0.8], [0.5]], "counts": [[1], [1], [1]]}
    policy = _policy(cost_model=costs.to_dict(), acceptance={"code": rates, "math": rates})
    doc = export_policy(policy, "vllm", OPTIONS)
    for domain in ("code", "math"):  # ngram and the draft model
        assert (
            "num_speculative_tokens_per_batch_size"
            not in (doc["domains"][domain]["speculative_config"])
        )


def test_vllm_refuses_early_exit_and_checks_its_ngram_rules():
    with pytest.raises(
        ExportError,
        match=r"^domain 'math': vllm main@002e77c1 cannot draft with early-exit\(exit_layer=8\): "
        r"vLLM has no early-exit drafter: .* export this domain to transformers "
        r"\(assistant_early_exit\), or tune it with the draft model or ngram$",
    ):
        export_policy(_policy(math=EARLY), "vllm", OPTIONS)
    version = ENGINES["vllm"].version(None)
    bad = {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(ExportError, match="breaks the rule prompt_lookup_min <= prompt_lookup_max"):
        version.validate({**bad, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "x")
    with pytest.raises(ExportError, match=r"prompt_lookup_min must be >= 1, got 0"):
        version.validate({**bad, "prompt_lookup_min": 0}, "x")
    with pytest.raises(ExportError, match="breaks the rule method draft_model needs model"):
        version.validate({"method": "draft_model", "num_speculative_tokens": 3}, "x")


# --- SGLang ---------------------------------------------------------------------------------------


def test_sglang_0_5_23_ngram_flags_and_the_honest_approximation():
    doc = export_policy(_policy(), "sglang", OPTIONS)
    assert doc["engine_version"] == "0.5.23"
    code = doc["domains"]["code"]
    assert code["flags"] == {
        "--speculative-algorithm": "NGRAM",
        "--speculative-num-draft-tokens": 4,  # K drafted nodes + the last accepted token
        "--speculative-ngram-min-bfs-breadth": 1,
        "--speculative-ngram-max-bfs-breadth": 1,
        "--speculative-ngram-match-type": "BFS",
    }
    assert code["serve_args"][:2] == ["--speculative-algorithm", "NGRAM"]
    assert code["approximated"] is True
    assert doc["domains"]["math"]["flags"]["--speculative-algorithm"] == "STANDALONE"
    assert doc["domains"]["math"]["approximated"] is False
    assert doc["approximation"].startswith(
        "code: SGLang's NGRAM is its own drafter, not vLLM's ngram rule: it matches every suffix"
    )
    assert doc["approximation"].endswith(MEASURED_NGRAM)


def test_sglang_refuses_early_exit_and_ngram_where_unchecked():
    with pytest.raises(
        ExportError,
        match=r"^domain 'math': sglang 0.5.23 cannot draft with early-exit\(exit_layer=8\): "
        r"SGLang has no early-exit drafter",
    ):
        export_policy(_policy(math=EARLY), "sglang", OPTIONS)
    with pytest.raises(
        ExportError,
        match=r"^domain 'code': sglang main@469c63e5 cannot draft with ngram\(.*\): its ngram "
        r"settings were checked at 0.5.23 only \(--engine-version 0.5.23\)$",
    ):
        export_policy(_policy(), "sglang", OPTIONS, engine_version="main@469c63e5")
    version = ENGINES["sglang"].version("0.5.23")
    with pytest.raises(ExportError, match="breaks the rule --speculative-ngram-min-bfs-breadth <="):
        version.validate(
            {
                "--speculative-algorithm": "NGRAM",
                "--speculative-num-draft-tokens": 4,
                "--speculative-ngram-min-bfs-breadth": 3,
                "--speculative-ngram-max-bfs-breadth": 1,
            },
            "x",
        )
    with pytest.raises(ExportError, match="breaks the rule STANDALONE needs"):
        version.validate(
            {"--speculative-algorithm": "STANDALONE", "--speculative-num-draft-tokens": 4}, "x"
        )


# --- llama.cpp ------------------------------------------------------------------------------------


def test_llamacpp_ngram_simple_flags_presets_and_approximation():
    doc = export_policy(_policy(), "llama.cpp", OPTIONS, source="policy.json")
    code = doc["domains"]["code"]
    assert code["flags"] == {
        "--model": "/m/target.gguf",
        "--spec-type": "ngram-simple",
        "--spec-ngram-simple-size-n": 2,  # prompt_lookup_min
        "--spec-ngram-simple-size-m": 3,  # K
    }
    assert code["server_args"] == [
        "llama-server",
        "--model",
        "/m/target.gguf",
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "2",
        "--spec-ngram-simple-size-m",
        "3",
    ]
    assert code["approximated"] is True and doc["domains"]["math"]["approximated"] is False
    assert (
        "[code]\nmodel = /m/target.gguf\nspec-type = ngram-simple\n"
        "spec-ngram-simple-size-n = 2\nspec-ngram-simple-size-m = 3\n"
    ) in doc["presets_ini"]
    assert doc["domains"]["math"]["flags"]["--spec-type"] == "draft-simple"
    assert doc["approximation"].startswith(
        "code: llama.cpp's ngram-simple is not vLLM's ngram rule: it matches one n-gram size N"
    )
    assert doc["approximation"].endswith(MEASURED_NGRAM)


def test_llamacpp_refuses_what_never_drafts_and_early_exit():
    # N = prompt_lookup_min = 4 > M = K = 3: common_ngram_simple_draft drops every draft
    deep = DrafterConfig("ngram", prompt_lookup_min=4, prompt_lookup_max=4)
    with pytest.raises(
        ExportError,
        match=r"^domain 'code': llama.cpp b11312: breaks the rule --spec-ngram-simple-size-m >= "
        r"--spec-ngram-simple-size-n \(ngram-simple drops a draft shorter than N",
    ):
        export_policy(_policy(code=deep), "llama.cpp", OPTIONS)
    with pytest.raises(
        ExportError,
        match=r"^domain 'code': llama.cpp b11312 cannot draft with early-exit\(exit_layer=8\): "
        r"llama.cpp has no early-exit drafter",
    ):
        export_policy(_policy(code=EARLY), "llama.cpp", OPTIONS)
    version = ENGINES["llama.cpp"].version(None)
    with pytest.raises(ExportError, match=r"--spec-ngram-simple-size-n must be <= 1024"):
        version.validate({"--model": "t", "--spec-ngram-simple-size-n": 1025}, "x")


def test_llamacpp_measured_setting_is_for_the_draft_model_only():
    entry = {
        "setting": "s",
        "k": 3,
        "flags": [],
        "target_gguf": "/m/t.gguf",
        "draft_gguf": "/m/d.gguf",
    }
    policy = _policy(llama_server={"domains": {"code": entry}, "fallback": None})
    with pytest.raises(
        ExportError,
        match=r"^domain 'code': the policy's llama_server setting was measured with the draft "
        r"model, but the policy gives this domain the ngram\(.*\) drafter",
    ):
        export_policy(policy, "llama.cpp", OPTIONS)


# --- transformers ---------------------------------------------------------------------------------


def test_transformers_prompt_lookup_and_early_exit():
    # no --target: OPTIONS' GGUF is not here, and an unreadable target is refused for early exit
    options = ExportOptions(draft=DRAFT)
    doc = export_policy(_policy(math=EARLY), "transformers", options)
    code, math = doc["domains"]["code"], doc["domains"]["math"]
    assert code["assistant_model"] is None and code["assistant_generation_config"] == {}
    assert code["generate_kwargs"] == {"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 4}
    assert code["snippet"] == (
        "outputs = model.generate(**inputs, prompt_lookup_num_tokens=3, max_matching_ngram_size=4)"
    )
    assert code["approximated"] is True  # prompt_lookup_min 2: transformers has no minimum
    assert doc["approximation"].startswith(
        "code: transformers' prompt lookup has no minimum match length"
    )
    assert math["assistant_model"] is None  # the model is its own assistant
    assert math["assistant_generation_config"] == {
        "num_assistant_tokens": 2,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    assert math["generate_kwargs"] == {"assistant_early_exit": 8}
    assert math["snippet"] == (
        "model.generation_config.num_assistant_tokens = 2\n"
        "model.generation_config.num_assistant_tokens_schedule = 'constant'\n"
        "model.generation_config.assistant_confidence_threshold = 0.0\n"
        "outputs = model.generate(**inputs, assistant_early_exit=8)"
    )
    reasoning = doc["domains"]["reasoning"]  # the draft model, as before
    assert reasoning["assistant_model"] == DRAFT and reasoning["generate_kwargs"] == {}
    assert reasoning["snippet"].endswith("model.generate(**inputs, assistant_model=assistant)")
    # prompt_lookup_min 1: transformers' rule is vLLM's (longest first, earliest occurrence)
    exact = _policy(code=DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=3))
    doc = export_policy(exact, "transformers", options)
    assert doc["approximation"] is None and doc["domains"]["code"]["approximated"] is False


# --- TensorRT-LLM ---------------------------------------------------------------------------------


def test_trtllm_ngram_decoding_config_and_refusals():
    doc = export_policy(_policy(), "trtllm", OPTIONS)
    assert doc["domains"]["code"]["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 3,
        "max_matching_ngram_size": 4,
        "is_keep_all": True,
        "is_use_oldest": True,
        "is_public_pool": False,
    }
    assert doc["domains"]["math"]["speculative_config"]["decoding_type"] == "Draft_Target"
    assert doc["approximation"].startswith("code: TensorRT-LLM's NGram is its own drafter")
    with pytest.raises(
        ExportError,
        match=r"^domain 'math': trtllm main@00043967 cannot draft with early-exit\(exit_layer=8\): "
        r"TensorRT-LLM has no early-exit drafter",
    ):
        export_policy(_policy(math=EARLY), "trtllm", OPTIONS)
    version = ENGINES["trtllm"].version(None)
    with pytest.raises(ExportError, match="breaks the rule decoding_type Draft_Target needs"):
        version.validate({"decoding_type": "Draft_Target", "max_draft_len": 2}, "x")
    with pytest.raises(ExportError, match="refuses field 'prompt_lookup_min'"):
        version.validate(
            {"decoding_type": "NGram", "max_draft_len": 2, "prompt_lookup_min": 2}, "x"
        )


# --- command --------------------------------------------------------------------------------------


def test_export_command_reads_drafters_from_the_policy_file(tmp_path):
    policy = tmp_path / "policy.json"
    _policy().save(policy)
    assert json.loads(policy.read_text())["domains"]["code"]["drafter"] == {
        "kind": "ngram",
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    out = tmp_path / "vllm.json"
    result = CliRunner().invoke(
        app, ["export", str(policy), "--to", "sglang", "--draft", DRAFT, "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "approximation: code: SGLang's NGRAM is its own drafter" in result.output
    assert json.loads(out.read_text())["domains"]["code"]["flags"]["--speculative-algorithm"] == (
        "NGRAM"
    )
    _policy(math=EARLY).save(policy)
    result = CliRunner().invoke(app, ["export", str(policy), "--to", "vllm", "--draft", DRAFT])
    assert result.exit_code == 2 and "vLLM has no early-exit drafter" in result.output
