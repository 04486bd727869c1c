"""llama-server, the llama.cpp backend: how to start it, and one running process.

:class:`ServerSetting` is one way of starting llama-server (threads and polling of each model,
batch sizes, chain length K or no speculation); :meth:`ServerSetting.flags` are exactly the
flags specscope runs and exports. :class:`LlamaServer` starts one (a free port, waits for
``/health``, its output in a log file) and stops it on exit or interrupt; :meth:`LlamaServer.complete`
returns a request's :class:`Completion` with the server's own timings and draft counts.

This module does not build the programs (:mod:`specscope.serving.llamacpp.programs` does) and
knows nothing of acceptance or policies.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Self

from .programs import LlamaTools, LlamaToolsError

# --- settings ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecType:
    """One of llama-server's ``--spec-type`` values as specscope runs it: whether it drafts with
    a draft model (``-md``), and for a model-free lookup the flags of its two sizes, N (the
    n-gram looked up) and M (the most tokens drafted), with llama.cpp's defaults (b11312,
    ``common/arg.cpp``; ``llama-server --help`` prints them)."""

    uses_draft_model: bool
    size_flags: tuple[str, str] | None = None  # (N's flag, M's flag); None: no sizes
    default_sizes: tuple[int, int] = (0, 0)  # (N, M)


# --spec-type values specscope runs (and the bench times); draft-simple's K is ServerSetting.k
SPEC_TYPES = {
    "draft-simple": SpecType(True),
    "ngram-simple": SpecType(
        False, ("--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"), (12, 48)
    ),
    "ngram-map-k": SpecType(
        False, ("--spec-ngram-map-k-size-n", "--spec-ngram-map-k-size-m"), (12, 48)
    ),
    "ngram-map-k4v": SpecType(
        False, ("--spec-ngram-map-k4v-size-n", "--spec-ngram-map-k4v-size-m"), (12, 48)
    ),
    # ngram-mod keeps its n-gram pool across requests: one request's output drafts the next
    "ngram-mod": SpecType(False, ("--spec-ngram-mod-n-match", "--spec-ngram-mod-n-max"), (24, 64)),
    "ngram-cache": SpecType(False),
}


@dataclass(frozen=True)
class ServerSetting:
    """One way of running llama-server on a CPU: what the pass-cost grid varies and what export
    writes. ``k`` = 0 is plain decoding (no draft model loaded).

    ``spec_type`` ``draft-simple``: the draft model drafts K = ``k`` tokens (``--spec-draft-n-max``;
    ``p_min``, ``draft_threads`` and ``draft_poll`` are its settings). A model-free lookup
    (``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``): no draft model; the
    last ``ngram_size`` tokens (N) are looked up and up to M = ``k`` tokens drafted (see
    :data:`SPEC_TYPES` for each type's flags); ``ngram-simple`` is the rule that
    :mod:`specscope.drafters.llama_ngram` measures. ``ngram-cache`` has no sizes (``k`` > 0 only
    turns it on)."""

    threads: int = 2
    poll: int = 50  # llama.cpp's default: busy-wait this long for work before sleeping
    batch: int = 2048
    ubatch: int = 512
    k: int = 0  # --spec-draft-n-max (draft-simple) or the lookup's M
    draft_threads: int | None = None  # default: the same as threads
    draft_poll: int | None = None  # default: the same as poll
    p_min: float = 0.0  # --spec-draft-p-min: 0 drafts all K tokens every step
    ctx: int = 4096
    spec_type: str = "draft-simple"
    ngram_size: int = 12  # a lookup's N (ngram-simple's default)

    def __post_init__(self) -> None:
        if self.spec_type not in SPEC_TYPES:
            raise LlamaToolsError(
                f"spec type {self.spec_type!r} is not one specscope runs; "
                f"choose one of {', '.join(SPEC_TYPES)}"
            )
        if not 0 <= self.poll <= 100 or (
            self.draft_poll is not None and not 0 <= self.draft_poll <= 100
        ):
            raise LlamaToolsError(
                f"setting {self.spec_name}: poll must be 0 to 100 (llama.cpp's --poll), got "
                f"poll={self.poll}, draft_poll={self.draft_poll}"
            )
        if self.k < 0 or self.ngram_size < 1 or not 0 <= self.p_min <= 1:
            raise LlamaToolsError(
                f"setting {self.spec_type}: k must be >= 0, the n-gram size >= 1 and p_min in "
                f"[0, 1]; got k={self.k}, ngram_size={self.ngram_size}, p_min={self.p_min}"
            )

    @property
    def uses_draft_model(self) -> bool:
        return self.k > 0 and SPEC_TYPES[self.spec_type].uses_draft_model

    @property
    def spec_name(self) -> str:
        """What speculates: ``plain``, ``k2``, ``k2-pmin0.5``, ``ngram-mod-n24-m64`` ..."""
        if not self.k:
            return "plain"
        if self.spec_type == "draft-simple":
            return f"k{self.k}" + (f"-pmin{self.p_min:g}" if self.p_min else "")
        if SPEC_TYPES[self.spec_type].size_flags is None:
            return self.spec_type
        return f"{self.spec_type}-n{self.ngram_size}-m{self.k}"

    @property
    def name(self) -> str:
        spec = self.spec_name
        if self.uses_draft_model:
            spec += (f"-td{self.draft_threads}" if self.draft_threads else "") + (
                f"-dpoll{self.draft_poll}" if self.draft_poll is not None else ""
            )
        return f"{spec}-t{self.threads}-poll{self.poll}-b{self.batch}-ub{self.ubatch}"

    def with_k(self, k: int) -> ServerSetting:
        return replace(self, k=k)

    def flags(self, draft_model: str | Path | None = None) -> list[str]:
        """llama-server's flags for this setting, models excepted (``-m`` goes first), with
        ``-md`` when speculating: all of them, defaults included, so that nothing is implicit."""
        out = [
            "-t",
            str(self.threads),
            "-tb",
            str(self.threads),
            "--poll",
            str(self.poll),
            "-b",
            str(self.batch),
            "-ub",
            str(self.ubatch),
            "-c",
            str(self.ctx),
            "-np",
            "1",
            "-ngl",
            "0",
        ]
        spec = SPEC_TYPES[self.spec_type]
        if self.k > 0 and not spec.uses_draft_model:
            out += ["--spec-type", self.spec_type]
            if spec.size_flags is not None:
                n_flag, m_flag = spec.size_flags
                out += [n_flag, str(self.ngram_size), m_flag, str(self.k)]
            if self.spec_type == "ngram-mod":  # n-min (default 48) must not exceed n-max
                out += ["--spec-ngram-mod-n-min", str(min(48, self.k))]
        elif self.k > 0:
            td = self.draft_threads or self.threads
            dp = self.poll if self.draft_poll is None else self.draft_poll
            if draft_model is not None:
                out += ["-md", str(draft_model)]
            out += [
                "--spec-type",
                "draft-simple",
                "--spec-draft-n-max",
                str(self.k),
                "--spec-draft-n-min",
                "0",
                "--spec-draft-p-min",
                f"{self.p_min:g}",
                "-td",
                str(td),
                "-tbd",
                str(td),
                "--spec-draft-poll",
                str(dp),
                "--spec-draft-ngl",
                "0",
            ]
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "name": self.name}

    @classmethod
    def parse(cls, text: str, base: ServerSetting | None = None) -> ServerSetting:
        """A candidate as written on the command line: ``plain``, ``draft-simple:k=2``,
        ``draft-simple:k=4,p_min=0.75``, ``ngram-simple`` (llama.cpp's sizes),
        ``ngram-simple:n=3,m=8``, ``ngram-mod``, ... on top of ``base``'s threads and
        polling; ``poll=N`` sets llama.cpp's ``--poll`` (``plain:poll=0``: threads sleep
        between passes)."""
        base = base or cls()
        kind, _, given = text.strip().partition(":")
        keys = {"k": "k", "m": "k", "n": "ngram_size", "p_min": "p_min", "poll": "poll"}
        example = (
            "plain, plain:poll=0, draft-simple:k=2,p_min=0.5, ngram-simple:n=3,m=8 or ngram-mod"
        )
        if kind != "plain" and kind not in SPEC_TYPES:
            raise LlamaToolsError(
                f"candidate {text!r}: {kind!r} is not a spec type specscope runs; choose plain "
                f"or one of {', '.join(SPEC_TYPES)} (e.g. {example})"
            )
        sizes: dict = {}  # the sizes given, by field
        for part in filter(None, given.split(",")):
            key, _, value = part.partition("=")
            key = key.strip()
            if key not in keys:
                raise LlamaToolsError(
                    f"candidate {text!r}: unknown size {key!r}; sizes are k (or m), n, p_min and "
                    f"poll (e.g. {example})"
                )
            try:
                sizes[keys[key]] = (float if key == "p_min" else int)(value)
            except ValueError:
                raise LlamaToolsError(
                    f"candidate {text!r}: {key}={value!r} is not a number"
                ) from None
        poll = sizes.pop("poll", base.poll)
        if kind == "plain":
            if sizes:
                raise LlamaToolsError(
                    f"candidate {text!r}: plain drafts nothing, so it takes only poll (e.g. plain:poll=0)"
                )
            return replace(base, k=0, spec_type="draft-simple", p_min=0.0, poll=poll)
        n, m = SPEC_TYPES[kind].default_sizes
        values = {"k": m or 3, "ngram_size": n or base.ngram_size, "p_min": 0.0, **sizes}
        if values["k"] < 1:
            raise LlamaToolsError(f"candidate {text!r}: k (m) must be >= 1; use plain for none")
        return replace(base, spec_type=kind, poll=poll, **values)

    @classmethod
    def from_dict(cls, d: dict) -> ServerSetting:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


# --- llama-server -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Completion:
    """One /completion response: the text, and the server's timings of the request."""

    content: str
    tokens: list[int]
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    prompt_n: int
    prompt_ms: float
    draft_n: int  # absent from the response when nothing was drafted: 0
    draft_n_accepted: int
    stop_type: str

    @classmethod
    def from_response(cls, r: dict) -> Completion:
        t = r.get("timings") or {}
        return cls(
            r.get("content", ""),
            [int(x) for x in r.get("tokens") or []],
            int(t.get("predicted_n", 0)),
            float(t.get("predicted_ms", 0.0)),
            float(t.get("predicted_per_second", 0.0)),
            int(t.get("prompt_n", 0)),
            float(t.get("prompt_ms", 0.0)),
            int(t.get("draft_n", 0)),
            int(t.get("draft_n_accepted", 0)),
            str(r.get("stop_type", "")),
        )


_LIVE: weakref.WeakSet = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for server in list(_LIVE):
        server.stop()


atexit.register(_stop_all_at_exit)


@dataclass
class LlamaServer:
    """A llama-server process: ``with LlamaServer(tools, target, setting, draft) as s: s.complete(...)``.

    Started on a free local port; ready once ``/health`` answers 200; its output goes to ``log``
    (a temporary file unless named); stopped on leaving the block, on interrupt and at exit."""

    tools: LlamaTools
    model: Path
    setting: ServerSetting
    draft: Path | None = None
    log: Path | None = None
    startup_timeout_s: float = 300.0
    port: int = 0
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    def __hash__(self) -> int:  # lives in a WeakSet
        return id(self)

    @property
    def argv(self) -> list[str]:
        if self.setting.uses_draft_model and self.draft is None:
            raise LlamaToolsError(
                f"setting {self.setting.name} speculates but no draft model was given"
            )
        return [
            str(self.tools.server),
            "-m",
            str(self.model),
            *self.setting.flags(self.draft if self.setting.uses_draft_model else None),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        for path in (self.model, self.draft):
            if path is not None and not Path(path).is_file():
                raise LlamaToolsError(f"GGUF file {path} does not exist")
        self.port = self.port or free_port()
        if self.log is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log = Path(name)
        with open(self.log, "ab") as out:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.tools.env(),
            )
        _LIVE.add(self)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self._proc.poll() is not None:
                rc, self._proc = self._proc.returncode, None
                raise LlamaToolsError(
                    f"llama-server exited with status {rc} while starting "
                    f"(log {self.log}): {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise LlamaToolsError(
                    f"llama-server was not ready within "
                    f"{self.startup_timeout_s:.0f} s; log {self.log}"
                )
            time.sleep(0.2)

    def log_tail(self, lines: int = 1) -> str:
        try:
            text = Path(self.log).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # llama-server shuts down cleanly on SIGINT
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def post(self, path: str, body: dict, timeout_s: float = 600.0) -> dict:
        """POST a JSON body to this server; its JSON answer."""
        if self._proc is None:
            raise LlamaToolsError("llama-server is not running")
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise LlamaToolsError(
                f"llama-server answered {e.code} to {path}: {e.read()[:300]!r}"
            ) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise LlamaToolsError(
                f"llama-server did not answer {path} ({e}); log {self.log}: {self.log_tail()}"
            ) from None

    def tokenize(self, text: str, timeout_s: float = 60.0) -> list[int]:
        """The token ids llama-server makes of ``text`` (its /tokenize; no special tokens added)."""
        return [int(t) for t in self.post("/tokenize", {"content": text}, timeout_s)["tokens"]]

    def complete(
        self, prompt: str | list[int], n_predict: int, timeout_s: float = 600.0
    ) -> Completion:
        """Greedy completion of ``prompt`` (text or token ids), no prompt cache reuse, so every
        request starts cold as a new conversation does."""
        body = {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "samplers": ["top_k"],
            "cache_prompt": False,
            "return_tokens": True,
            "seed": 0,
        }
        return Completion.from_response(self.post("/completion", body, timeout_s))
