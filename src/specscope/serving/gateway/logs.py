"""The gateway's two logs: JSON lines written whole or not at all, links refused.

It does not decide what goes to which log (:mod:`.proxy`) or read them (``specscope ingest``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from pathlib import Path

from ...errors import SpecscopeError


class GatewayError(SpecscopeError):
    """The gateway cannot start: a log it cannot open, an address it cannot listen on."""


def json_bytes(obj, allow_nan: bool = True) -> bytes:
    """``obj`` as UTF-8 JSON; strings holding lone surrogates (valid escapes in JSON, not
    encodable as UTF-8) make the whole text ASCII with ``\\u`` escapes instead."""
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=allow_nan).encode()
    except UnicodeEncodeError:
        return json.dumps(obj, allow_nan=allow_nan).encode()


def _is_stream(path: Path) -> bool:
    """A log to write into as it is (a device, a FIFO, anything under /dev or /proc), not a
    regular file whose links are refused and whose errors log is named after it."""
    if Path(path).absolute().parts[1:2] in (("dev",), ("proc",)):
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


class RequestLog:
    """An append-only JSON-lines file: each record one line, whole or not at all.

    Opened with ``O_APPEND`` and, for a regular file, ``O_NOFOLLOW`` (a symbolic link at the path
    is refused, not written through). A record is written by ``write`` calls on the one event
    loop thread (so concurrent requests never interleave), retried after a short write; a write
    that fails (a full disk) cuts the file back to its length before the record and raises."""

    def __init__(self, path: str | Path, option: str = "--log"):
        self.path = Path(path)
        stream = _is_stream(self.path)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        if not stream:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags |= os.O_NOFOLLOW
        try:
            self._fd = os.open(self.path, flags, 0o666)
        except OSError as e:
            if e.errno == errno.ELOOP and self.path.is_symlink():
                raise GatewayError(
                    f"{option} {self.path} is a symbolic link; the gateway does not write "
                    "through links (name the file itself)"
                ) from None
            raise
        info = os.fstat(self._fd)
        self.regular = stat.S_ISREG(info.st_mode)
        self.identity = (info.st_dev, info.st_ino)

    def append(self, record: dict) -> None:
        line = memoryview(json_bytes(record) + b"\n")
        size = os.fstat(self._fd).st_size if self.regular else 0
        try:
            while line:
                line = line[os.write(self._fd, line) :]
        except OSError:
            if self.regular:
                try:
                    os.ftruncate(self._fd, size)
                except OSError as e:
                    print(
                        f"specscope gateway: {self.path}: cannot cut back a torn line: {e}",
                        file=sys.stderr,
                    )
            raise

    def close(self) -> None:
        os.close(self._fd)


def errors_path(log: str | Path) -> Path:
    """The errors log beside a request log: ``gateway.jsonl`` -> ``gateway.errors.jsonl``."""
    log = Path(log)
    return log.with_name(log.stem + ".errors" + (log.suffix or ".jsonl"))


def open_logs(log: str | Path, errors_log: str | Path | None = None) -> dict[str, RequestLog]:
    """The request log and the errors log, opened (so that one that cannot be written fails at
    start). The errors log is named after a regular request log unless given; a request log
    that is no regular file (``/dev/null``, a FIFO) needs ``errors_log``; the two may be one
    file only if it is no regular file (``--log /dev/null --errors-log /dev/null``)."""
    if errors_log is None and _is_stream(Path(log)):
        raise GatewayError(
            f"--log {log} is not a regular file, so no errors log is named after it; "
            "give one with --errors-log (it may be the same device, e.g. /dev/null)"
        )
    requests = RequestLog(log, "--log")
    try:
        errors = RequestLog(errors_log or errors_path(log), "--errors-log")
    except BaseException:
        requests.close()
        raise
    if requests.regular and requests.identity == errors.identity:
        requests.close()
        errors.close()
        raise GatewayError(
            f"--errors-log {errors_log} is the request log {log}; ingest reads the request log "
            "whole, so failures must go to another file"
        )
    return {"requests": requests, "errors": errors}
