"""An int8 model's weights kept between runs, so that a later int8 load reads int8 weights instead
of loading the model in float32 and quantising every linear again.

An entry is a directory under ``<cache>/int8/``, named by a key over the source's kind and weight
fingerprint and the torch, transformers and entry-format versions. It holds:

- ``int8.safetensors``: each :class:`~specscope.models.int8.Int8Linear`'s int8 weight, per-channel
  scales (float64) and float32 bias;
- ``float.safetensors``: every other parameter and buffer, non-persistent buffers (rotary
  frequencies) included, so nothing is computed again at load;
- ``meta.json``: the model's config, generation config, class, float parameter count, commit,
  which names share a tensor, which weights it holds (source kind and fingerprint: writing an
  entry removes the entries of the same weights made by other versions), and the sha256 of the
  two tensor files.

Tensors and JSON only, nothing a load executes. An entry is written whole into a temporary
directory and renamed into place, so an interrupted write leaves no entry. An entry is used only
when it is the model being loaded: its ``weights`` are the key's, its config is the source's
(:func:`same_config`), its tensor files hash to the digests it recorded, and neither it nor a
file in it is a symbolic link. Any other entry (damaged, planted, edited, or whose model class or
tensors do not match its skeleton) is ignored with a one-line warning, and the model is quantised
and kept again. A load from an entry gives the model bit for bit (its tests compare tensors,
logits and records). Not cached: sources with no fingerprint known before loading (hub ids), and models
whose code comes from the hub (``trust_remote_code``), which a skeleton would need.

What it does not do: quantise (:mod:`~specscope.models.int8`) or decide when a model is int8
(:mod:`~specscope.models.load`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from ..cache import cache_dir
from ..files import discard, os_error_reason, place_dir, temporary_name
from .fingerprint import file_sha256
from .int8 import Int8Linear

FORMAT = 2
TENSOR_FILES = ("int8.safetensors", "float.safetensors")
ENTRY_FILES = (*TENSOR_FILES, "meta.json")
# Config fields that say where, by which version or in which float dtype a config was written:
# an entry (always float32) and its source differ in them without being different models.
_NOT_IDENTITY = frozenset(
    {"transformers_version", "_name_or_path", "_commit_hash", "dtype", "torch_dtype"}
    | {"quantization_config"}  # a GGUF source's; its dequantised model has none
)

log = logging.getLogger(__name__)


@dataclass
class CachedInt8:
    """A model rebuilt from an entry, and what the float model's load would have told."""

    model: torch.nn.Module
    parameters: int  # of the float model, tied weights once


class UnusableEntry(Exception):
    """Why an entry is not the model being loaded (internal: the entry is ignored)."""


def entry_dir(kind: str, fingerprint: str) -> Path:
    """Where the int8 weights are kept of the model whose weights have ``fingerprint``, loaded as
    ``kind`` (a source kind of :func:`~specscope.models.load.resolve_source`): the demo pair's
    bf16 checkpoint and its GGUF file share a fingerprint but not their float32 weights."""
    versions = f"torch {torch.__version__} transformers {transformers.__version__}"
    key = hashlib.sha256(f"{kind} {fingerprint} {versions} format {FORMAT}".encode())
    key = key.hexdigest()[:24]
    return cache_dir() / "int8" / key


def same_config(stored: dict, source: dict) -> bool:
    """Whether an entry's config is its source's, fields in :data:`_NOT_IDENTITY` aside (nested
    configs too), after a JSON round trip (tuples and lists, ints and floats as JSON keeps them)."""

    def identity(value):
        if isinstance(value, dict):
            return {k: identity(v) for k, v in value.items() if k not in _NOT_IDENTITY}
        if isinstance(value, list):
            return [identity(v) for v in value]
        return value

    def round_trip(config: dict):
        return identity(json.loads(json.dumps(config, sort_keys=True, default=str)))

    return round_trip(stored) == round_trip(source)


def _int8_modules(model: torch.nn.Module) -> dict[str, Int8Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, Int8Linear)}


def _float_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer outside the int8 linears, by name, shared tensors under each of
    their names."""
    inside = tuple(f"{name}." for name in _int8_modules(model))
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    return {name: t for name, t in named if t is not None and not name.startswith(inside)}


def _failure(error: BaseException) -> str:
    """One line for why a write or a read of an entry failed."""
    if isinstance(error, OSError):
        return os_error_reason(error)
    return f"{type(error).__name__}: {error}".splitlines()[0]


def save_int8(model: torch.nn.Module, kind: str, fingerprint: str, parameters: int) -> None:
    """Keep ``model``'s int8 weights (the model of :func:`entry_dir`'s ``kind`` and
    ``fingerprint``), whole or not at all: a failed write, a full disk included (safetensors
    raises its own error there, not OSError), leaves no entry and no temporary behind, warns in
    one line, and the model is still usable. Entries of the same weights made by other torch or
    transformers versions are removed (an upgrade leaves no 3 GB behind; two environments of
    different versions sharing a cache each write their own again)."""
    from safetensors.torch import save_file

    entry, weights = entry_dir(kind, fingerprint), f"{kind} {fingerprint}"

    int8: dict[str, torch.Tensor] = {}
    for name, module in _int8_modules(model).items():
        int8[f"{name}.weight"], int8[f"{name}.scale"] = module.int8_weight()
        if module.bias is not None:
            int8[f"{name}.bias"] = module.bias
    floats, aliases, first_name = {}, {}, {}
    for name, tensor in _float_tensors(model).items():
        if id(tensor) in first_name:
            aliases[name] = first_name[id(tensor)]
        else:
            first_name[id(tensor)] = name
            floats[name] = tensor.contiguous()
    meta = {
        "format": FORMAT,
        "model_class": type(model).__name__,
        "config": model.config.to_dict(),
        "generation_config": model.generation_config.to_dict()
        if model.generation_config is not None
        else None,
        "commit": getattr(model.config, "_commit_hash", None),
        "parameters": parameters,
        "int8": sorted(_int8_modules(model)),
        "aliases": aliases,
        "weights": weights,
    }
    tmp = Path(temporary_name(entry))
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        save_file(int8, tmp / "int8.safetensors")
        save_file(floats, tmp / "float.safetensors")
        meta["sha256"] = {name: file_sha256(tmp / name) for name in TENSOR_FILES}
        (tmp / "meta.json").write_text(json.dumps(meta))
        if not place_dir(tmp, entry):
            return  # another process kept these weights first
    except BaseException as error:  # a full disk is a SafetensorError, not an OSError
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(error, Exception):
            raise
        log.warning(
            "int8 weights not kept in %s (%s); the next int8 load quantises again",
            entry.parent,
            _failure(error),
        )
        return
    for other in entry.parent.iterdir():
        try:
            superseded = other != entry and _meta(other).get("weights") == weights
        except (OSError, ValueError):
            continue
        if superseded:
            discard(other)


def _meta(entry: Path) -> dict:
    meta = json.loads((entry / "meta.json").read_text())
    if not isinstance(meta, dict):
        raise ValueError(f"{entry}/meta.json is not an object")
    return meta


def _checked_meta(entry: Path, weights: str, config: dict) -> dict:
    """The entry's meta.json, once the entry is shown to hold ``weights`` with ``config`` and its
    tensor files are the ones it was written with; else :class:`UnusableEntry` saying why."""
    if entry.is_symlink():
        raise UnusableEntry("it is a symbolic link")
    for name in ENTRY_FILES:
        if (entry / name).is_symlink():
            raise UnusableEntry(f"{name} is a symbolic link")
    meta = _meta(entry)
    if meta.get("format") != FORMAT:
        raise UnusableEntry(f"format {meta.get('format')!r}, not {FORMAT}")
    if meta.get("weights") != weights:
        raise UnusableEntry(f"it holds the weights {meta.get('weights')!r}, not {weights!r}")
    if not isinstance(meta.get("config"), dict) or not same_config(meta["config"], config):
        raise UnusableEntry("its config is not the model's config")
    recorded = meta.get("sha256")
    if not isinstance(recorded, dict):
        raise UnusableEntry("it records no sha256 of its tensor files")
    with ThreadPoolExecutor(len(TENSOR_FILES)) as pool:
        digests = dict(zip(TENSOR_FILES, pool.map(file_sha256, [entry / n for n in TENSOR_FILES])))
    for name, digest in digests.items():
        if recorded.get(name) != digest:
            raise UnusableEntry(f"{name} does not have the sha256 it was written with")
    return meta


def load_int8(kind: str, fingerprint: str, config: dict) -> CachedInt8 | None:
    """The kept int8 model of :func:`entry_dir`'s ``kind`` and ``fingerprint``, whose source's
    config (``config.to_dict()`` of the config the source loads with) is ``config``: on the CPU in
    float32 with int8 linears. None where there is no usable entry (the caller then quantises and
    keeps it again); an entry that is there but not usable is named in a one-line warning."""
    from safetensors import SafetensorError

    entry = entry_dir(kind, fingerprint)
    if not entry.exists() and not entry.is_symlink():
        return None
    try:
        return _read_entry(entry, f"{kind} {fingerprint}", config)
    except UnusableEntry as why:
        reason = str(why)
    except (
        OSError,
        KeyError,
        ValueError,
        TypeError,
        AttributeError,  # a module name the skeleton does not have
        RuntimeError,
        SafetensorError,
    ) as error:
        reason = f"damaged: {_failure(error)}"
    log.warning("ignoring the int8 cache entry %s (%s); quantising again", entry, reason)
    return None


def _read_entry(entry: Path, weights: str, config: dict) -> CachedInt8:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    meta = _checked_meta(entry, weights, config)
    int8 = load_file(entry / "int8.safetensors")
    floats = load_file(entry / "float.safetensors")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(**meta["config"]), dtype=torch.float32, attn_implementation="sdpa"
        )
    if type(model).__name__ != meta["model_class"]:
        raise UnusableEntry(
            f"it holds a {meta['model_class']}, its config a {type(model).__name__}"
        )

    def rebuild(name: str) -> Int8Linear:
        return Int8Linear.from_int8(
            int8[f"{name}.weight"], int8[f"{name}.scale"], int8.get(f"{name}.bias")
        )

    # fbgemm packs a weight on one thread and releases the GIL: pack on every thread torch has
    with ThreadPoolExecutor(torch.get_num_threads()) as pool:
        for name, linear in zip(meta["int8"], pool.map(rebuild, meta["int8"])):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, linear)
    for name, skeleton in _float_tensors(model).items():
        tensor = floats[meta["aliases"].get(name, name)]
        if tensor.shape != skeleton.shape or tensor.dtype != skeleton.dtype:
            raise UnusableEntry(
                f"{name} is {tensor.dtype} {tuple(tensor.shape)}, not "
                f"{skeleton.dtype} {tuple(skeleton.shape)}"
            )
        parent, _, leaf = name.rpartition(".")
        module = model.get_submodule(parent)
        if leaf in module._parameters:
            module._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)
        else:
            module._buffers[leaf] = tensor
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise UnusableEntry("it lacks some of the model's tensors")
    if meta["generation_config"] is not None:
        model.generation_config = GenerationConfig.from_dict(meta["generation_config"])
    model.config._commit_hash = meta["commit"]
    return CachedInt8(model.eval(), meta["parameters"])
