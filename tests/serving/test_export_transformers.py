"""The transformers export, run: the assistant really drafts the exported number of tokens.

transformers 5.23.0, src/transformers/generation/candidate_generator.py@v5.23.0:
``AssistedCandidateGenerator.__init__`` reads ``num_assistant_tokens`` and
``assistant_confidence_threshold`` from a deep copy of ``assistant_model.generation_config``;
``get_candidates`` drafts ``min(num_assistant_tokens, room left)`` tokens. The same values passed
to ``generate()`` are ignored (issue #40739): the second test shows it, so the first cannot pass
by accident. ``EarlyExitCandidateGenerator`` is that generator with the model as its own assistant
(run through ``assistant_early_exit`` layers); ``PromptLookupCandidateGenerator`` takes
``prompt_lookup_num_tokens`` and ``max_matching_ngram_size`` from ``generate()``
(generation/utils.py ``_get_candidate_generator``).
"""

import pytest
import torch

from specscope.drafters import DrafterConfig
from specscope.models.tiny import tiny_model
from specscope.serving.export import ExportOptions, export_policy
from specscope.trees import TreeShape
from specscope.tune.policy import PolicyFile

transformers = pytest.importorskip("transformers")
from transformers.generation.candidate_generator import (
    AssistedCandidateGenerator,
    PromptLookupCandidateGenerator,
)

VOCAB = 64
MAX_NEW = 13


@pytest.fixture
def drafted(monkeypatch):
    """Per assisted step: (tokens drafted, the generator's num_assistant_tokens, its confidence
    threshold, the room left before max_length), recorded from get_candidates."""
    lengths: list[tuple[int, int, float, int]] = []
    original = AssistedCandidateGenerator.get_candidates

    def recording(self, input_ids, **kwargs):
        candidates, logits = original(self, input_ids, **kwargs)
        lengths.append(
            (
                candidates.shape[1] - input_ids.shape[1],
                self.num_assistant_tokens,
                self.assistant_generation_config.assistant_confidence_threshold,
                self.main_model_max_length - input_ids.shape[1] - 1,
            )
        )
        return candidates, logits

    monkeypatch.setattr(AssistedCandidateGenerator, "get_candidates", recording)
    return lengths


def _pair():
    target = tiny_model("llama", VOCAB, seed=2, layers=2)
    assistant = tiny_model("llama", VOCAB, seed=1, layers=1)
    for model in (target, assistant):
        model.generation_config.pad_token_id = 0
    return target, assistant


def _generate(target, assistant, **kwargs):
    prompt = torch.tensor([[5, 9, 17, 3, 22]])
    return target.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=False,
        max_new_tokens=MAX_NEW,
        assistant_model=assistant,
        **kwargs,
    )


def test_assistant_drafts_the_exported_number_of_tokens(drafted):
    chain = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
    doc = export_policy(
        PolicyFile(trees={"code": chain}), "transformers", ExportOptions(draft="assistant")
    )
    settings = doc["domains"]["code"]["assistant_generation_config"]
    target, assistant = _pair()
    for name, value in settings.items():  # what the exported snippet does
        setattr(assistant.generation_config, name, value)
    out = _generate(target, assistant)
    assert out.shape[1] == 5 + MAX_NEW
    assert {(k, t) for _, k, t, _ in drafted} == {(3, 0.0)}
    # every step drafts K = 3 tokens, fewer only where fewer are left before max_length
    assert [n for n, *_ in drafted] == [min(3, room) for *_, room in drafted]
    assert sum(room >= 3 for *_, room in drafted) >= 2


def test_generate_kwargs_are_not_what_the_assistant_uses(drafted):
    target, assistant = _pair()
    _generate(
        target,
        assistant,
        num_assistant_tokens=3,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
    )
    # the assistant kept its own generation_config: 20 tokens, stopped by confidence 0.4
    assert {(k, t) for _, k, t, _ in drafted} == {(20, 0.4)}
    assert [n for n, *_ in drafted] != [min(3, room) for *_, room in drafted]


def test_early_exit_drafts_the_exported_tokens_with_the_exported_layers(monkeypatch):
    """The exported values on the model's own generation_config and assistant_early_exit to
    generate(): every draft is K tokens from the model cut after exit_layer layers."""
    seen: list[tuple[int, int, int]] = []  # (tokens drafted, layers run, room left)
    original = AssistedCandidateGenerator.get_candidates

    def recording(self, input_ids, **kwargs):
        layers = self.assistant_model.model.config.num_hidden_layers  # set by the early exit
        candidates, logits = original(self, input_ids, **kwargs)
        room = self.main_model_max_length - input_ids.shape[1] - 1
        seen.append((candidates.shape[1] - input_ids.shape[1], layers, room))
        return candidates, logits

    monkeypatch.setattr(AssistedCandidateGenerator, "get_candidates", recording)
    chain = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
    policy = PolicyFile(
        trees={"code": chain}, drafters={"code": DrafterConfig("early-exit", exit_layer=1)}
    )
    doc = export_policy(policy, "transformers", ExportOptions())["domains"]["code"]
    target, _ = _pair()
    for name, value in doc["assistant_generation_config"].items():  # what the snippet does
        setattr(target.generation_config, name, value)
    prompt = torch.tensor([[5, 9, 17, 3, 22]])
    out = target.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=False,
        max_new_tokens=MAX_NEW,
        **doc["generate_kwargs"],
    )
    assert out.shape[1] == 5 + MAX_NEW
    assert {layers for _, layers, _ in seen} == {1}  # the target's first layer, of 2
    assert [n for n, _, _ in seen] == [min(3, room) for *_, room in seen]
    assert target.model.config.num_hidden_layers == 2  # restored after each draft


def test_prompt_lookup_takes_the_exported_settings(monkeypatch):
    made: list[tuple[int, int]] = []
    original = PromptLookupCandidateGenerator.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append((self.num_output_tokens, self.max_matching_ngram_size))

    monkeypatch.setattr(PromptLookupCandidateGenerator, "__init__", recording)
    chain = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
    ngram = DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=2)
    policy = PolicyFile(trees={"code": chain}, drafters={"code": ngram})
    doc = export_policy(policy, "transformers", ExportOptions())["domains"]["code"]
    target, _ = _pair()
    prompt = torch.tensor([[5, 9, 17, 3, 5, 9, 17, 3, 5, 9]])
    target.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=False,
        max_new_tokens=MAX_NEW,
        **doc["generate_kwargs"],
    )
    assert made == [(3, 2)]


def test_export_checks_an_early_exit_against_the_target_it_is_given(tmp_path, tiny_dirs):
    """``specscope export --to transformers --target T``: an exit layer at or past T's layer
    count (2 here, read from T's config) is refused in one line, though the policy records no
    target; one below it exports with no "not checked" note."""
    from typer.testing import CliRunner

    from specscope.cli import app

    target = str(tiny_dirs["llama", "target"])
    chain = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
    policy = tmp_path / "policy.json"
    args = ["export", str(policy), "--to", "transformers", "--target", target]
    PolicyFile(
        trees={"code": chain}, drafters={"code": DrafterConfig("early-exit", exit_layer=2)}
    ).save(policy)
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2, refused.output
    lines = refused.output.strip().splitlines()
    assert len(lines) == 1 and "domain 'code': exit_layer must be in 1..1" in lines[0]
    assert "the target has 2 layers" in lines[0] and "the export's target" in lines[0]
    PolicyFile(  # past the target's layers, as at them
        trees={"code": chain}, drafters={"code": DrafterConfig("early-exit", exit_layer=5)}
    ).save(policy)
    past = CliRunner().invoke(app, args)
    assert past.exit_code == 2 and len(past.output.strip().splitlines()) == 1, past.output
    assert "exit_layer must be in 1..1 (the target has 2 layers), got 5" in past.output
    # a target given but unreadable here is refused, not exported with the layer unchecked
    absent = str(tmp_path / "absent")
    unread = CliRunner().invoke(app, [*args[:-1], absent])
    assert unread.exit_code == 2 and len(unread.output.strip().splitlines()) == 1, unread.output
    assert unread.output.startswith(
        f"error: early-exit layer(s) 5 (code) cannot be checked against the target {absent!r}"
    )
    PolicyFile(
        trees={"code": chain}, drafters={"code": DrafterConfig("early-exit", exit_layer=1)}
    ).save(policy)
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert "not checked" not in done.output
    assert '"assistant_early_exit": 1' in done.output
    # without --target (and none recorded) the note says the layer is unchecked
    unchecked = CliRunner().invoke(app, args[:-2])
    assert unchecked.exit_code == 0 and "not checked against the target" in unchecked.output
