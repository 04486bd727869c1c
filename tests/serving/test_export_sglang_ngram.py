"""SGLang 0.5.23's NGRAM, as the export says it: which tokens enter its trie (each request's last
--speculative-ngram-max-trie-depth) and that every step verifies the whole node budget, padded
(speculative/ngram_worker.py, kernels/jit/csrc/ngram_corpus/result.cpp)."""

from __future__ import annotations

from specscope.drafters import DrafterConfig
from specscope.serving.export import ExportOptions, export_policy
from specscope.serving.export_plan import MEASURED_NGRAM
from specscope.serving.sglang.export import NGRAM_APPROXIMATION
from specscope.trees import TreeShape
from specscope.tune.policy import PolicyFile

NGRAM = DrafterConfig("ngram", prompt_lookup_min=2, prompt_lookup_max=4)


def _document() -> dict:
    policy = PolicyFile(
        trees={"code": TreeShape.chain(3), "math": TreeShape.chain(2)},
        uniform=None,
        drafters={"code": NGRAM},
    )
    return export_policy(policy, "sglang", ExportOptions(draft="d", target="t"))


def test_the_ngram_note_says_what_enters_the_trie_and_that_every_step_verifies_the_budget():
    doc = _document()
    assert doc["engine_version"] == "0.5.23"
    assert doc["domains"]["code"]["approximated"] is True
    assert doc["domains"]["math"]["approximated"] is False  # the draft model: no ngram note
    note = doc["approximation"]
    assert note == f"code: {NGRAM_APPROXIMATION}"
    assert (
        "inserts only the last --speculative-ngram-max-trie-depth (18) tokens of each request"
        in note
    )
    assert "speculative/ngram_worker.py 403-420" in note
    assert "pads every draft to the node budget with token 0 and always verifies it" in note
    assert "ngram_worker.py 301-302, ngram_corpus/result.cpp 34" in note
    assert "a step without a match still costs a full verify" in note
    assert note.endswith(MEASURED_NGRAM)


def test_a_policy_without_ngram_domains_carries_no_ngram_note():
    policy = PolicyFile(trees={"math": TreeShape.chain(2)}, uniform=None)
    doc = export_policy(policy, "sglang", ExportOptions(draft="d", target="t"))
    assert doc["approximation"] is None or "NGRAM" not in doc["approximation"]
