"""The one base class of specscope's expected failures, and the check for optional extras.

Every error that a user can cause (a bad option, a missing file, an unusable run directory, a
package that is not installed) derives from :class:`SpecscopeError`; its message says what was
wrong and what is allowed, in one line. The command line prints that line and exits with status 2
(docs/getting-started.md: "Errors and exit codes"). Anything else that escapes is a bug in
specscope and keeps its traceback.

This module knows nothing of models, runs or analysis.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata


class SpecscopeError(Exception):
    """An expected failure: the message names the cause and what to do."""


class MissingExtraError(SpecscopeError, ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


@cache
def extras() -> dict[str, tuple[str, ...]]:
    """Each optional extra of the installed specscope and the distributions it requires.

    Read from the package's own metadata (``Requires-Dist: X; extra == "name"``), so pyproject.toml
    is the one list. Empty when specscope runs from a source tree that is not installed.
    """
    from packaging.requirements import Requirement

    try:
        lines = metadata.requires("specscope") or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for line in lines:
        req = Requirement(line)
        if req.marker is None:
            continue
        for name in _extra_names(str(req.marker)):
            out.setdefault(name, []).append(req.name)
    return {name: tuple(dists) for name, dists in out.items()}


def _extra_names(marker: str) -> list[str]:
    # markers read like 'extra == "demo"' (one extra per line in practice)
    return [
        part.split("==", 1)[1].strip().strip("'\"")
        for part in marker.split(" or ")
        if part.strip().startswith("extra")
    ]


def installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def missing(extra: str) -> tuple[str, ...]:
    """The distributions of ``extra`` that are not installed (none when specscope is not)."""
    return tuple(d for d in extras().get(extra, ()) if not installed(d))


def require(extra: str, purpose: str, distributions: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtraError` unless ``distributions`` (default: all of ``extra``) are
    installed; ``purpose`` says what needs them, e.g. "loading a GGUF file"."""
    wanted = extras().get(extra, ()) if distributions is None else distributions
    absent = [d for d in wanted if not installed(d)]
    if absent:
        raise MissingExtraError(
            f"{purpose} needs {', '.join(absent)}: pip install 'specscope[{extra}]'"
        )
