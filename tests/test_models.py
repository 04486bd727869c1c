"""Pairs: vocabulary check, source resolution, demo-part assembly and its errors; int8 on the CPU."""

import hashlib
from importlib import metadata

import pytest
import torch

from conftest import make_model, make_tokenizer, near_pair
from specscope.decode import DecodeConfig, SpeculativeDecoder, plain_generate
from specscope.models import ModelLoadError, PairConfig, demo, load_pair, resolve_source
from specscope.models.config import DemoModel
from specscope.models.gguf import load_gguf
from specscope.models.load import check_vocabularies
from specscope.trees import DynamicTree, TreeShape
from specscope.tune.policy import make_speculation


def test_same_vocabulary_passes(tokenizer):
    check_vocabularies(tokenizer, make_tokenizer())


def test_different_vocabulary_names_first_differing_token(tokenizer):
    other = make_tokenizer()
    other.add_tokens(["<extra>"])
    with pytest.raises(
        ModelLoadError, match=r"token id 259 is None in the draft and '<extra>' in the target"
    ):
        check_vocabularies(tokenizer, other)


def test_pair_with_different_vocabularies_is_refused_before_loading_weights(tiny_dirs, tmp_path):
    other = make_tokenizer()
    other.add_tokens(["<extra>"])
    bad = tmp_path / "bad-target"
    bad.mkdir()
    other.save_pretrained(bad)  # a config and a tokenizer, no weights: loading them would fail
    (bad / "config.json").write_text((tiny_dirs["qwen2", "target"] / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="vocabularies differ"):
        load_pair(PairConfig(draft=str(tiny_dirs["qwen2", "draft"]), target=str(bad)))


def test_pair_loads_local_directories(tiny_dirs):
    pair = load_pair(
        PairConfig(
            draft=str(tiny_dirs["llama", "draft"]),
            target=str(tiny_dirs["llama", "target"]),
            dtype="float32",
        )
    )
    assert pair.vocab_size == len(pair.tokenizer)
    assert pair.provenance["target"]["architecture"] == "LlamaForCausalLM"
    assert not pair.target.model.training


def test_source_resolution(tmp_path):
    assert resolve_source("demo:target") == ("demo", "target")
    assert resolve_source("TinyLlama/TinyLlama-1.1B-Chat-v1.0") == (
        "hub",
        "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    )
    (tmp_path / "config.json").write_text("{}")
    assert resolve_source(str(tmp_path)) == ("dir", tmp_path)
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_source(str(tmp_path.parent))
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_source(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        PairConfig(dtype="fp8")


def _fake_demo(tmp_path, monkeypatch, corrupt_part: int | None):
    """Three fake part packages with RECORD hashes; optionally one part corrupted on disk."""
    chunks = [bytes([i]) * 1000 for i in range(3)]
    spec = DemoModel(
        name="fake",
        package_prefix="fake-part",
        version="1.0",
        num_parts=3,
        size=3000,
        sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
    )
    files = {}
    for i, chunk in enumerate(chunks, start=1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(chunk if i != corrupt_part else b"x" * 1000)
        record = metadata.PackagePath(f"fake_part{i}/data/part{i:02d}.bin")
        digest = hashlib.sha256(chunk).digest()
        import base64

        record.hash = metadata.FileHash(
            "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        )
        files[f"fake-part{i}"] = (path, record)
    monkeypatch.setitem(demo.DEMO_MODELS, "fake", spec)
    monkeypatch.setattr(demo, "_part_file", lambda package: files[package])
    monkeypatch.setattr(demo.metadata, "version", lambda package: "1.0")
    return chunks


def test_demo_parts_assemble_and_verify(tmp_path, monkeypatch):
    chunks = _fake_demo(tmp_path, monkeypatch, corrupt_part=None)
    out = demo.assemble_demo_gguf("fake", tmp_path / "out" / "fake.gguf")
    assert out.read_bytes() == b"".join(chunks)


def test_corrupt_demo_part_names_the_package_to_reinstall(tmp_path, monkeypatch):
    _fake_demo(tmp_path, monkeypatch, corrupt_part=2)
    with pytest.raises(
        ModelLoadError, match="reinstall: pip install --force-reinstall fake-part2$"
    ):
        demo.assemble_demo_gguf("fake", tmp_path / "out" / "fake.gguf")
    assert not (tmp_path / "out" / "fake.gguf").exists()


def test_a_full_disk_is_named_before_assembly_and_leaves_no_partial_file(tmp_path, monkeypatch):
    import builtins
    import errno
    from collections import namedtuple

    _fake_demo(tmp_path, monkeypatch, corrupt_part=None)
    out = tmp_path / "out" / "fake.gguf"
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(demo.shutil, "disk_usage", lambda path: usage(10_000, 9_900, 100))
    with pytest.raises(
        ModelLoadError,
        match=r"assembling fake needs 0.0 GB free in .*out, which has "
        r"0.0 GB; .*SPECSCOPE_CACHE",
    ):
        demo.assemble_demo_gguf("fake", out)
    assert list(out.parent.iterdir()) == []

    # Room reported, but the disk fills up while writing (another process took it).
    monkeypatch.setattr(demo.shutil, "disk_usage", lambda path: usage(10_000, 0, 10_000))

    class FullDisk:
        def __init__(self, path, mode):
            self.sink = builtins.open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.sink.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(
        demo,
        "open",
        lambda path, mode: builtins.open(path, mode) if mode == "rb" else FullDisk(path, mode),
        raising=False,
    )
    with pytest.raises(ModelLoadError, match="filled up while assembling fake"):
        demo.assemble_demo_gguf("fake", out)
    assert list(out.parent.iterdir()) == []


def test_missing_demo_part_names_the_extra(monkeypatch):
    monkeypatch.setitem(
        demo.DEMO_MODELS, "fake", DemoModel("fake", "no-such-package-part", "1", 1, 1, "0")
    )
    with pytest.raises(ModelLoadError, match=r"pip install 'specscope\[demo\]'"):
        demo.assemble_demo_gguf("fake", demo.cache_dir() / "never.gguf")


def test_gguf_without_its_extra_names_the_extra(tmp_path, monkeypatch):
    # a missing optional package is a one-line error naming the extra, never a traceback
    from typer.testing import CliRunner

    from specscope import errors
    from specscope.cli import app

    real = errors.installed
    monkeypatch.setattr(errors, "installed", lambda d: d != "accelerate" and real(d))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(
        errors.MissingExtraError, match=r"accelerate: pip install 'specscope\[gguf\]'"
    ):
        load_gguf(gguf, "float32")
    result = CliRunner().invoke(app, ["decode", "hi", "--draft", str(gguf), "--target", str(gguf)])
    assert result.exit_code == 2
    assert "specscope[gguf]" in result.output and "Traceback" not in result.output


# --- int8 on the CPU ----------------------------------------------------------------------------

INT8_PROMPTS = ["def add(a, b):\n    return", "The capital of France is", "x = [1, 2, 3]\nfor i in"]


def test_int8_linear_is_batch_invariant_and_close():
    from specscope.models.int8 import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    int8 = Int8Linear(linear)
    x = torch.randn(2, 9, 64) * torch.rand(2, 9, 1) * 10
    with torch.inference_mode():
        together = int8(x)
        alone = torch.stack(
            [torch.cat([int8(x[b, i : i + 1]) for i in range(9)]) for b in range(2)]
        )
        exact = linear(x)
    assert torch.equal(together, alone)  # bit for bit, whatever else is in the batch
    assert ((together - exact).norm() / exact.norm()) < 0.03


def test_rowwise_attention_causal_prefix_equals_the_masked_gather():
    # A prefill passes no mask: each query reads a prefix view of the keys instead of gathering
    # them through the mask; the results must be the same bits.
    from specscope.models.int8 import rowwise_attention

    torch.manual_seed(0)
    query = torch.randn(2, 4, 7, 16)
    key, value = torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    causal = torch.ones(7, 10, dtype=torch.bool).tril(3)[None, None].expand(2, 1, 7, 10)
    no_mask, _ = rowwise_attention(None, query, key, value, None)
    masked, _ = rowwise_attention(None, query, key, value, causal)
    assert torch.equal(no_mask, masked)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_pair_greedy_speculation_is_exactly_plain(tokenizer, arch):
    """int8 models with row-wise attention: every tree, transformers' greedy generate() and its
    assisted generation give the same tokens, because a token's logits do not depend on the pass."""
    from specscope.models.int8 import quantize_int8, use_rowwise_attention
    from specscope.tune.bench import hf_generate

    draft, target = near_pair(arch, tokenizer, 0.3, seed=7)
    quantize_int8(draft)
    use_rowwise_attention(quantize_int8(target))
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    config = DecodeConfig(max_new_tokens=24)
    for prompt in INT8_PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        plain, _ = hf_generate(target, ids, 24, frozenset())
        assert plain_generate(target, ids, config, len(tokenizer)).tokens == plain
        for spec in (
            make_speculation("paper"),
            make_speculation("chain", depth=6),
            TreeShape.parse("[(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]"),
            DynamicTree(12, 4, 3),
        ):
            assert decoder.generate(ids, spec, config).tokens == plain, (prompt, spec)
        assert hf_generate(target, ids, 24, frozenset(), assistant=draft)[0] == plain


def test_int8_needs_float32_on_the_cpu(tokenizer):
    from specscope.models import ModelLoadError, PairConfig
    from specscope.models.int8 import quantize_int8

    with pytest.raises(ModelLoadError, match="float32"):
        quantize_int8(make_model("llama", len(tokenizer), seed=1).to(torch.bfloat16))
    with pytest.raises(ModelLoadError, match="float32"):
        PairConfig(quantize="int8")  # dtype defaults to bfloat16
    with pytest.raises(ModelLoadError, match="unknown quantization"):
        PairConfig(dtype="float32", quantize="int4")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_tree_pass_logits_equal_one_token_passes_bit_for_bit(tokenizer, arch):
    """A tree pass over the cache gives each node exactly the logits of decoding its path alone."""
    from transformers import DynamicCache

    from specscope.core.passes import feed
    from specscope.models.int8 import quantize_int8, use_rowwise_attention

    target = quantize_int8(make_model(arch, len(tokenizer), seed=5, layers=2))
    use_rowwise_attention(target)
    ids = tokenizer(INT8_PROMPTS[1])["input_ids"]
    shape = TreeShape.parse("[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]")
    nodes = torch.tensor([11, 12, 13, 14, 15, 16])
    with torch.inference_mode():
        cache = DynamicCache(config=target.config)
        target(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        L = len(ids)
        tree = feed(
            target,
            cache,
            nodes[None],
            L + torch.tensor(shape.depths)[None] - 1,
            torch.ones(1, len(shape), L, dtype=torch.bool),
            shape.ancestor_mask(),
        )[0]
        for n in range(len(shape)):
            path = [a for a in range(len(shape)) if shape.ancestor_mask()[n, a]]  # root first
            alone = DynamicCache(config=target.config)
            target(input_ids=torch.tensor([ids]), past_key_values=alone, use_cache=True)
            for a in path:
                logits = target(
                    input_ids=nodes[a].view(1, 1), past_key_values=alone, use_cache=True
                ).logits[0, -1]
            assert torch.equal(tree[n], logits), n
