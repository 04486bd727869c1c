"""specscope export: each engine's documented fields, literal expected outputs."""

import json

import pytest
from specscope.cli import app
from specscope.export import ExportError, ExportOptions, export_policy
from specscope.trees import TreeShape
from specscope.tune.policy import PolicyFile
from typer.testing import CliRunner

CHAIN3 = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
TREE = TreeShape.from_paths([(0,), (1,), (0, 0)])
CHAIN2 = TreeShape.from_paths([(0,), (0, 0)])
DRAFT = "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def _policy(math=TREE) -> PolicyFile:
    return PolicyFile(trees={"code": CHAIN3, "math": math, "chat": None}, uniform=CHAIN2)


def test_vllm_speculative_config():
    doc = export_policy(_policy(), "vllm", ExportOptions(draft=DRAFT, method="eagle"))
    code = doc["domains"]["code"]["speculative_config"]
    assert code == {"method": "eagle", "model": DRAFT, "num_speculative_tokens": 3}
    math = doc["domains"]["math"]["speculative_config"]
    assert math == {"method": "eagle", "model": DRAFT, "num_speculative_tokens": 3,
                    "speculative_token_tree": "[(0,), (1,), (0, 0)]"}
    # vLLM's own check: one tuple per drafted token
    assert len(eval(math["speculative_token_tree"])) == math["num_speculative_tokens"]
    assert doc["domains"]["chat"]["speculative_config"] is None
    assert doc["domains"]["chat"]["serve_args"] == []
    assert doc["domains"]["code"]["serve_args"] == [
        "--speculative-config",
        '{"method": "eagle", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", '
        '"num_speculative_tokens": 3}']
    assert doc["fallback"]["speculative_config"]["num_speculative_tokens"] == 2


def test_vllm_draft_model_method_takes_chains_only():
    doc = export_policy(_policy(math=CHAIN2), "vllm", ExportOptions(draft=DRAFT))
    assert doc["domains"]["math"]["speculative_config"] == {
        "method": "draft_model", "model": DRAFT, "num_speculative_tokens": 2}
    with pytest.raises(ExportError, match=r"domain 'math': tree \[\(0,\), \(1,\), \(0, 0\)\] has "
                                          r"branches, but vLLM method 'draft_model' drafts a chain"):
        export_policy(_policy(), "vllm", ExportOptions(draft=DRAFT))


def test_sglang_flags():
    doc = export_policy(_policy(), "sglang", ExportOptions(draft=DRAFT))
    assert doc["domains"]["code"]["serve_args"] == [
        "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", DRAFT,
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]
    flags = doc["domains"]["math"]["flags"]
    assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
            flags["--speculative-num-draft-tokens"]) == (2, 2, 4)
    assert doc["domains"]["chat"]["serve_args"] == []


def test_llamacpp_request_fields():
    doc = export_policy(_policy(math=CHAIN2), "llama.cpp")
    assert doc["domains"]["code"]["request"] == {
        "speculative.n_max": 3, "speculative.n_min": 0, "speculative.p_min": 0.0}
    assert doc["domains"]["chat"]["request"]["speculative.n_max"] == 0  # no drafting
    with pytest.raises(ExportError, match="llama.cpp drafts a chain"):
        export_policy(_policy(), "llama.cpp")


def test_trtllm_eagle_choices():
    doc = export_policy(_policy(), "trtllm", ExportOptions(draft="/models/draft"))
    assert doc["domains"]["math"]["speculative_config"] == {
        "decoding_type": "Eagle", "max_draft_len": 2, "eagle_choices": [[0], [1], [0, 0]],
        "speculative_model_dir": "/models/draft"}
    assert doc["domains"]["chat"]["speculative_config"] is None


def test_transformers_generate_kwargs():
    doc = export_policy(_policy(math=CHAIN2), "transformers", ExportOptions(draft=DRAFT))
    assert doc["domains"]["code"] == {
        "tree": "[(0,), (0, 0), (0, 0, 0)]", "assistant_model": DRAFT,
        "generate_kwargs": {"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0}}
    assert doc["domains"]["chat"] == {"tree": "none", "assistant_model": None,
                                      "generate_kwargs": {}}
    with pytest.raises(ExportError, match="transformers drafts a chain"):
        export_policy(_policy(), "transformers", ExportOptions(draft=DRAFT))


def test_routing_rule_is_the_router_that_picks_domains():
    from specscope.tune.router import RuleRouter

    doc = export_policy(_policy(math=CHAIN2), "llama.cpp")
    routing = doc["routing"]
    assert routing["fallback"] == "chat" and routing["threshold"] == RuleRouter().threshold
    assert len(routing["rules"]) == len(RuleRouter().rules)


def test_bad_exports_are_one_line_errors_and_write_nothing(tmp_path):
    policy = tmp_path / "policy.json"
    _policy().save(policy)
    out = tmp_path / "out" / "vllm.json"
    runner = CliRunner()
    result = runner.invoke(app, ["export", str(policy), "--to", "llama.cpp", "--out", str(out)])
    assert result.exit_code == 2 and "has branches" in result.output and not out.exists()
    result = runner.invoke(app, ["export", str(policy), "--to", "tgi"])
    assert result.exit_code == 2
    assert "unknown engine 'tgi'; allowed: vllm, sglang, llama.cpp, trtllm, transformers" in result.output
    result = runner.invoke(app, ["export", str(policy), "--to", "vllm", "--method", "eagle"])
    assert result.exit_code == 2 and "pass --draft" in result.output
    result = runner.invoke(app, ["export", str(policy), "--to", "vllm", "--method", "eagle",
                                 "--draft", DRAFT, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["domains"]["math"]["speculative_config"][
        "speculative_token_tree"] == "[(0,), (1,), (0, 0)]"
    assert [p.name for p in out.parent.iterdir()] == ["vllm.json"]  # no temporary left behind
