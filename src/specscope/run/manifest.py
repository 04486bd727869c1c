"""A run's provenance: its manifest (config, tree, models, packages, machines, commit, prompts),
the check that a run being resumed still has the same prompts and models, and config differences.
"""

from __future__ import annotations

import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from .. import __version__
from ..hardware import cpu_features, cpu_name, usable_cpus
from ..prompts.items import (
    PromptItem,
    prompt_sha256,
)
from ..records import (
    SCHEMA_VERSION,
)
from .config import RunConfig, RunConfigError


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("specscope", "torch", "transformers", "pyarrow", "numpy", "gguf"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def this_machine() -> dict:
    """The machine measuring here: CPU name, instruction sets, usable CPUs, torch's CPU kernels and
    the GPU if one is visible. Floating-point rounding follows the kernels, so records reproduce bit
    for bit only on a machine that runs the same ones."""
    import torch

    machine = {
        "cpu": cpu_name(),
        "features": cpu_features(),
        "cpus": usable_cpus(),
        "torch_cpu_kernels": str(torch.backends.cpu.get_cpu_capability()),
    }
    if torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name()
    return machine


def machines_with_this(manifest: dict | None) -> list[dict]:
    """The machines a run's records came from, this one added if it is new (a run resumed
    elsewhere holds records of both)."""
    machines = list((manifest or {}).get("machines") or [])
    here = this_machine()
    return machines if here in machines else [*machines, here]


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _flatten(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def config_differences(manifest: dict, config: RunConfig) -> list[str]:
    """The ``section.key`` names in which ``config`` differs from a run manifest's config."""
    recorded = manifest["config"]
    asked = (recorded.get("pair") or {}).get("trust_remote_code") is True
    # compared, never loaded: the recorded choice is kept (and not warned about)
    old = _flatten(RunConfig.from_dict(recorded, trust_remote_code=asked).to_dict())
    return [key for key, value in _flatten(config.to_dict()).items() if old.get(key) != value]


def run_manifest(
    config: RunConfig,
    items: list[PromptItem],
    empty: list[str],
    models: dict,
    created: str | None = None,
) -> dict:
    """The manifest of a run that is starting (status ``running``); ``models``: pair provenance."""
    shape = config.tree.shape()
    return {
        "schema_version": SCHEMA_VERSION,
        "specscope_version": __version__,
        "run_id": config.run_id,
        "status": "running",
        "created": created or now_utc(),
        "config": config.to_dict(),
        "tree": {"paths": shape.to_paths_literal(), "nodes_per_depth": list(shape.depth_counts())},
        "models": models,
        "packages": package_versions(),
        "git_commit": git_commit(),
        "seed": config.seed,
        "prompts": {
            "count": len(items),
            "sources": sorted({item.source for item in items}),
            "ids": [item.id for item in items],
            "skipped_empty": empty,
        },
    }


def prompt_hashes(items: list[PromptItem]) -> dict[str, str]:
    return {item.id: prompt_sha256(item.messages) for item in items}


def check_identity(
    out_dir: Path, manifest: dict, hashes: dict[str, str], models: dict[str, dict]
) -> None:
    """Refuse to resume a run whose prompts or models changed since it started, naming them."""
    before = manifest.get("prompts", {}).get("sha256") or {}
    changed = sorted(pid for pid, h in hashes.items() if pid in before and before[pid] != h)
    if changed:
        raise RunConfigError(
            f"{out_dir}: the text of prompt(s) {', '.join(changed[:5])} changed since the run "
            "started (same id, other messages); use another directory, or --overwrite"
        )
    for role, now in models.items():
        old = (manifest.get("models") or {}).get(role) or {}
        if (
            old.get("fingerprint")
            and now.get("fingerprint")
            and old["fingerprint"] != now["fingerprint"]
        ):
            raise RunConfigError(
                f"{out_dir}: the {role} model at {now['source']} changed since the run started "
                f"(weights fingerprint {old['fingerprint'][:12]}... now {now['fingerprint'][:12]}...); "
                "use another directory, or --overwrite"
            )
