"""Reading the JSON files users hand specscope, and writing files without harm.

Reading: :func:`read_json_object` and :func:`read_toml_table` turn every way a JSON or TOML file
can be unusable (missing, unreadable, not UTF-8, not JSON or TOML, nested too deep, not an object)
into one error naming the file.

Every file specscope writes on a local disk goes through :func:`write_output`:

- **Whole or not at all.** The bytes go to a temporary file with a unique name in the target's
  directory (two writers never share a temporary) and are renamed over the target. A rename
  replaces a symbolic link planted at the target instead of writing through it.
- **No writes through planted links.** With ``inside=ROOT`` (a run or sweep directory that may have
  come from someone else) every directory from ROOT down to the file must be a real directory, not
  a link; a link there is refused, naming it.
- **A named output that is a stream** (``-o /dev/stdout``, anything under /dev or /proc, a FIFO)
  is written in place, as the user asked, never replaced by a regular file.
- **Modes follow the umask**, and a file that is replaced keeps its mode.

:func:`check_output` refuses, before any work, an output path that is also an input of the command
or one of the files specscope owns inside a run directory, and :func:`local_location` reads a
``file://`` URI as a local path and refuses any other URI where an option takes local paths.

This module knows nothing of models, records or analysis; RunDir's pyarrow writes (which also
reach object stores) use the same unique temporaries (``records.rundir.write_file``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import json
import math
import os
import shutil
import stat
import tomllib
import uuid
from pathlib import Path
from urllib.parse import unquote

from .errors import SpecscopeError


class OutputError(SpecscopeError):
    """An output path that would overwrite an input, a run's own file, or write through a link."""


# What to do about the failures of a disk that users meet most.
_OS_ERROR_HINTS = {
    errno.ENOSPC: "free space, or write elsewhere",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.ENAMETOOLONG: "shorten the name",
}


def os_error_reason(error: OSError) -> str:
    """An OSError's reason in words, with what to do where that is known:
    ``No space left on device (free space, or write elsewhere)``."""
    reason = error.strerror or (os.strerror(error.errno) if error.errno else str(error))
    hint = _OS_ERROR_HINTS.get(error.errno)
    return f"{reason} ({hint})" if hint else reason


def umask() -> int:
    """The process's umask (read without changing it for longer than one call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temporary_name(path: str | Path) -> str:
    """A hidden temporary name beside ``path`` that no other writer uses."""
    path = str(path)
    parent, _, name = path.rpartition("/")
    return (
        f"{parent}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        if parent
        else f".{name}.{uuid.uuid4().hex[:12]}.tmp"
    )


def check_no_links(path: Path, inside: Path) -> None:
    """Refuse ``path`` if any directory from ``inside`` down to it, or ``path`` itself, is a
    symbolic link (a link planted in a run directory could point anywhere)."""
    root, path = Path(inside).absolute(), Path(path).absolute()
    try:
        relative = path.relative_to(root)
    except ValueError:
        raise OutputError(f"{path} is outside {root}") from None
    probe = root
    if probe.is_symlink():
        raise OutputError(
            f"{probe} is a symbolic link; specscope writes only into real directories"
        )
    for part in relative.parts:
        probe = probe / part
        if probe.is_symlink():
            raise OutputError(
                f"{probe} is a symbolic link; specscope does not write through links "
                "in a run directory (remove the link)"
            )


def make_dirs(path: Path, inside: Path | None = None) -> None:
    """``mkdir -p`` with the umask's mode, refusing links below ``inside``."""
    path = Path(path)
    if inside is not None:
        check_no_links(path, inside)
    path.mkdir(parents=True, exist_ok=True)


def _is_stream(path: Path) -> bool:
    """Whether a user-named output is a stream to write into rather than a file to replace."""
    if path.absolute().parts[1:2] in (("dev",), ("proc",)):
        return True
    return path.exists() and not stat.S_ISREG(path.stat().st_mode)


def discard(path: Path) -> None:
    """Remove a directory (or file) kept by a cache; where a link stands in its place, only the
    link: nothing it points at is touched."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def place_dir(tmp: Path, target: Path) -> bool:
    """Rename the finished directory ``tmp`` to ``target`` (replacing what :func:`discard` leaves
    of an older one), so that ``target`` is never seen half-written. False, with ``tmp``
    removed, where another process placed ``target`` in the meantime."""
    discard(target)
    try:
        os.replace(tmp, target)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def write_output(path: str | Path, data: bytes | str, inside: Path | None = None) -> Path:
    """Write ``data`` to ``path`` whole or not at all (see the module docstring).

    ``inside``: the run or sweep directory the file belongs to; links below it are refused.
    Without ``inside`` (an output the user named), a path under /dev or /proc (``/dev/stdout``,
    even when the shell redirected it to a file) or an existing path that is not a regular file
    (a FIFO, a device) is written in place, as a stream.
    """
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    if inside is not None:
        check_no_links(path, inside)
    elif _is_stream(path):
        if path.is_dir():
            raise OutputError(f"{path} is a directory; give a file name")
        with _naming(path), open(path, "wb") as sink:  # the user named a stream: write into it
            sink.write(raw)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = (
            stat.S_IMODE(path.stat().st_mode) if path.is_file() and not path.is_symlink() else None
        )
    except OSError:
        mode = None
    tmp = temporary_name(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
    try:
        with _naming(path), os.fdopen(fd, "wb") as sink:
            sink.write(raw)
            if mode is not None:
                os.fchmod(sink.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def _naming(path: Path):
    """An OSError of writing to an open file (a full disk, ``File too large``) names ``path``:
    the write itself reports no file name."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


def _read_bytes(path: Path, error: type[SpecscopeError], label: str, kind: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{label} does not exist") from None
    except IsADirectoryError:
        raise error(f"{label} is a directory, not a {kind} file") from None
    except OSError as e:
        raise error(f"cannot read {label}: {e.strerror or e}") from None


def read_json(path: str | Path, error: type[SpecscopeError], what: str = "") -> object:
    """A JSON file's value, or ``error`` naming the file and what was wrong."""
    path = Path(path)
    label = f"{what} {path}".strip()
    return parse_json(_read_bytes(path, error, label, "JSON"), error, label)


def read_json_object(path: str | Path, error: type[SpecscopeError], what: str = "") -> dict:
    """A JSON file whose root is an object, or ``error`` naming the file and what was wrong."""
    path = Path(path)
    label = f"{what} {path}".strip()
    return parse_json_object(_read_bytes(path, error, label, "JSON"), error, label)


def read_text(path: str | Path, error: type[SpecscopeError], what: str = "") -> str:
    """A UTF-8 text file, or ``error`` naming it (missing, a directory, unreadable, not UTF-8)."""
    path = Path(path)
    label = f"{what} {path}".strip()
    try:
        return _read_bytes(path, error, label, "text").decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{label}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None


def read_toml_table(path: str | Path, error: type[SpecscopeError], what: str = "") -> dict:
    """A TOML file's table, or ``error`` naming the file and what was wrong (unreadable, not
    UTF-8, not TOML, nested too deeply)."""
    label = f"{what} {path}".strip()
    text = read_text(path, error, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{label}: not valid TOML ({e})") from None
    except RecursionError:
        raise error(f"{label}: TOML nested too deeply to be a specscope file") from None


def parse_json(raw: bytes, error: type[SpecscopeError], label: str) -> object:
    """The JSON value in ``raw`` (the bytes of the file or line ``label`` names), or ``error``
    naming it and what was wrong: not UTF-8, not JSON, nested too deep, or numbers Python cannot
    convert (an integer of thousands of digits)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{label}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{label}: not valid JSON ({e})") from None
    except RecursionError:
        raise error(f"{label}: JSON nested too deeply to be a specscope file") from None
    except ValueError as e:
        raise error(f"{label}: not usable JSON ({e})") from None


def parse_json_object(raw: bytes, error: type[SpecscopeError], label: str) -> dict:
    """:func:`parse_json` of a file whose root must be an object."""
    data = parse_json(raw, error, label)
    if not isinstance(data, dict):
        raise error(f"{label} must hold a JSON object, got a {type(data).__name__}")
    return data


JSON_KEYS = (str, int, float, bool, type(None))  # keys json.dumps writes itself


def to_jsonable(obj):
    """``obj`` as JSON values: dataclasses as objects, tuples as lists, enums as their values,
    paths as text, numpy scalars as Python ones, and every NaN or infinite float as None (strict
    JSON has no NaN)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {k if isinstance(k, JSON_KEYS) else str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return to_jsonable(obj.item())
    return obj


def json_text(obj, indent: int | None = 2) -> str:
    """Strict JSON text: NaN and infinities become null, never the literal ``NaN``."""
    return (
        json.dumps(
            to_jsonable(obj), indent=indent, allow_nan=False, default=str, ensure_ascii=False
        )
        + "\n"
    )


def write_json(path: str | Path, obj, inside: Path | None = None) -> Path:
    """:func:`write_output` of strict JSON (see :func:`json_text`)."""
    return write_output(path, json_text(obj), inside)


# What specscope owns in a run or sweep directory: never an output named with -o.
RUN_OWNED = (
    "manifest.json",
    "nodes.parquet",
    "steps.parquet",
    "prompts.parquet",
    "requests.parquet",
    "sweep.json",
    "parts",
)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path: str | Path, inputs: tuple[str | Path, ...] = (), option: str = "-o") -> Path:
    """Refuse an output path that is one of the command's ``inputs`` or a file specscope owns in
    a run directory (a manifest, records, parts); return it as a Path."""
    text = str(path)
    if "://" in text:
        raise OutputError(
            f"{option} {text}: this option writes a local file; URIs are not supported here"
        )
    path = Path(text)
    for source in inputs:
        if source is None:
            continue
        source = Path(source)
        if path.absolute() == source.absolute() or _same_file(path, source):
            raise OutputError(
                f"{option} {path} is also this command's input {source}; give another output file"
            )
    resolved = path.absolute()
    for parent in resolved.parents:
        if (parent / "manifest.json").is_file() or (parent / "sweep.json").is_file():
            if resolved.relative_to(parent).parts[0] in RUN_OWNED:
                raise OutputError(
                    f"{option} {path} is a file specscope owns in the run "
                    f"directory {parent}; give a path outside it"
                )
            break
    return path


def check_output_file(
    path: str | Path, inputs: tuple[str | Path, ...] = (), option: str = "-o"
) -> Path:
    """:func:`check_output` for an output that is one file: also refuse a directory, and a path
    whose parent cannot be a directory (a path under a file), before any work is done."""
    path = check_output(path, inputs, option)
    if path.is_dir():
        raise OutputError(f"{option} {path} is a directory; give a file name")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{option} {path}: {parent} is a file, not a directory")
            break
    return path


def inside_of(path: str | Path, root: str | Path) -> Path | None:
    """``root`` if ``path`` lies in it, else None (an output elsewhere, which the user named).

    An output inside a run directory is checked at once (:func:`check_no_links`), before any work:
    a link planted between ``root`` and ``path`` is refused; pass the returned root on as
    :func:`write_output`'s ``inside`` so that each write checks again."""
    try:
        Path(path).absolute().relative_to(Path(root).absolute())
    except ValueError:
        return None
    check_no_links(path, root)
    return Path(root)


def local_location(value: str | Path | None, option: str) -> Path | None:
    """``value`` as a local Path: a path, or a ``file://`` URI read as RunDir reads it
    (``file:///data/run`` is ``/data/run``); any other URI (``s3://``, ``hdfs://``) is refused
    with the option's name, never taken for a local directory named ``s3:``."""
    if value is None:
        return None
    text = str(value)
    scheme, found, rest = text.partition("://")
    if not found:
        return Path(text)
    if scheme.lower() == "file":
        host, _, path = rest.partition("/")
        if host in ("", "localhost"):
            return Path("/" + unquote(path))
        raise OutputError(
            f"{option} {text}: a file:// URI names a path on this machine "
            f"(file:///PATH), not on host {host!r}"
        )
    raise OutputError(
        f"{option} {text}: this command reads and writes local directories; "
        "give a local path or a file:// URI (copy the data here first)"
    )
