"""Fingerprints of model weights, so that a run knows what it measured.

A run's manifest records, for each model, its absolute source and a sha256 over its files (and
for each prompt a sha256 of its messages: :func:`specscope.prompts.items.prompt_sha256`). Resuming
a run compares them and refuses when any changed (new weights under the same path).

Hashing a 14 GB checkpoint takes minutes, so file digests are cached in
``cache_dir()/fingerprints.json``, keyed by absolute path, size and modification time: a file is
hashed again only when one of those changes. A cache that cannot be used (unreadable, not UTF-8,
not a JSON object, entries of another shape) only costs hashing again. This module does not load
models.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..cache import cache_dir
from ..errors import SpecscopeError
from ..files import read_json_object, write_output

# Files that decide a checkpoint's outputs; README, licences and hidden files do not.
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".json",
    ".model",
    ".txt",
    ".tiktoken",
    ".py",
    ".jinja",
)


def _cache_file() -> Path:
    return cache_dir() / "fingerprints.json"


def _load_cache() -> dict:
    """The cached digests; empty where the cache is missing or unusable (it is rebuilt)."""
    try:
        return read_json_object(_cache_file(), SpecscopeError, "fingerprint cache")
    except SpecscopeError:
        return {}


def _save_cache(cache: dict) -> None:
    try:
        write_output(_cache_file(), json.dumps(cache, sort_keys=True))
    except (OSError, SpecscopeError):
        pass  # a read-only cache only costs re-hashing next time


def file_sha256(path: Path, cache: dict | None = None) -> str:
    """sha256 of a file, from ``cache`` when its size and mtime are unchanged."""
    path = Path(path).resolve()
    stat = path.stat()
    key = str(path)
    stamp = [stat.st_size, stat.st_mtime_ns]
    entry = cache.get(key) if cache is not None else None
    if (
        isinstance(entry, dict)
        and entry.get("stamp") == stamp
        and isinstance(entry.get("sha256"), str)
    ):
        return entry["sha256"]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    if cache is not None:
        cache[key] = {"stamp": stamp, "sha256": digest.hexdigest()}
    return digest.hexdigest()


def model_fingerprint(path: str | Path) -> str:
    """sha256 over a model file, or over a directory's weight, config and tokenizer files (names
    and contents), cached by size and mtime."""
    path = Path(path).resolve()
    cache = _load_cache()
    if path.is_file():
        result = file_sha256(path, cache)
    else:
        digest = hashlib.sha256()
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix in WEIGHT_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        for f in files:
            digest.update(f"{f.relative_to(path).as_posix()}\0{file_sha256(f, cache)}\n".encode())
        result = digest.hexdigest()
    _save_cache(cache)
    return result
