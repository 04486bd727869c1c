"""The transformers export, run: the assistant really drafts the exported number of tokens.

transformers 5.23.0, src/transformers/generation/candidate_generator.py@v5.23.0:
``AssistedCandidateGenerator.__init__`` reads ``num_assistant_tokens`` and
``assistant_confidence_threshold`` from a deep copy of ``assistant_model.generation_config``;
``get_candidates`` drafts ``min(num_assistant_tokens, room left)`` tokens. The same values passed
to ``generate()`` are ignored (issue #40739): the second test shows it, so the first cannot pass
by accident.
"""

import pytest
import torch

from conftest import make_model
from specscope.serving.export import ExportOptions, export_policy
from specscope.trees import TreeShape
from specscope.tune.policy import PolicyFile

transformers = pytest.importorskip("transformers")
from transformers.generation.candidate_generator import AssistedCandidateGenerator

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
    target = make_model("llama", VOCAB, seed=2, layers=2)
    assistant = make_model("llama", VOCAB, seed=1, layers=1)
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
