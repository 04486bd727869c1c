"""llama.cpp's own programs: build them, time their passes with llama-bench, quantise GGUF files.

:func:`build_llama_tools` compiles llama-server, llama-bench and llama-quantize from one pinned
llama.cpp source (:data:`LLAMA_SOURCE`: llama.cpp b11312, commit 0c1e57098, as the sdist of
llama-cpp-python 0.3.36 vendors it whole; pip downloads it, its sha256 is checked) into
specscope's cache, once: a finished build is reused. Nothing installs or imports llama-cpp-python
itself. ``$SPECSCOPE_LLAMA_BIN`` names a directory of already built programs instead.

:func:`run_llama_bench` times passes of 1..N tokens in llama.cpp's own loop (llama-bench's
prompt-processing tests at a context depth) and :func:`parse_llama_bench` reads its JSON output;
:func:`quantize` runs llama-quantize.

This module does not run llama-server (:mod:`specscope.serving.llamacpp.server` does), knows
nothing of acceptance or policies (:mod:`specscope.serving.llamacpp.costs` and
:mod:`specscope.serving.llamacpp.study` do) and needs no Python binding of llama.cpp.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...cache import cache_dir
from ...errors import SpecscopeError

PROGRAMS = ("llama-server", "llama-bench", "llama-quantize")
BIN_ENV = "SPECSCOPE_LLAMA_BIN"
BUILD_MARKER = "specscope-build.json"  # written last: its presence means the build finished
# ggml's AMX kernels (compiled in by -march=native where the CPU has AMX) crash llama-server b11312
# at its warm-up pass, a segmentation fault in libggml-cpu, on AMX machines here (Intel Xeon with
# AMX-INT8 under a VM: `load_tensors: AMX model buffer size`, then SIGSEGV; --no-repack, which
# skips the AMX buffer, runs). GCC and Clang let an explicit -mno-* win over -march=native, so
# the build leaves AMX out and ggml uses its AVX512/AVX2 kernels.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
X86 = platform.machine().lower() in ("x86_64", "amd64")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    *((f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}") if X86 else ()),
)


@dataclass(frozen=True)
class LlamaSource:
    """The llama.cpp that :func:`build_llama_tools` compiles: the sdist of llama-cpp-python
    ``version`` on PyPI (``sha256`` of its archive), which vendors llama.cpp ``build`` (``commit``)
    whole under vendor/llama.cpp."""

    version: str  # of the llama-cpp-python sdist; names the build's cache directory
    build: str  # llama.cpp's build number (its release tag)
    commit: str  # llama.cpp's commit, abbreviated
    sha256: str  # of llama_cpp_python-{version}.tar.gz

    @property
    def requirement(self) -> str:
        return f"llama-cpp-python=={self.version}"


# the llama.cpp whose source the docstrings, the export's flags and the ingest's fields cite
LLAMA_SOURCE = LlamaSource(
    "0.3.36",
    "b11312",
    "0c1e57098",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
)


class LlamaToolsError(SpecscopeError, RuntimeError):
    """llama.cpp's programs could not be built, found or run; the message says why."""


# --- building -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaTools:
    """A directory holding llama-server, llama-bench and llama-quantize, and their version."""

    bin_dir: Path
    version: str  # the llama-cpp-python sdist whose vendored llama.cpp built them ("" unknown)

    def path(self, program: str) -> Path:
        return self.bin_dir / program

    @property
    def server(self) -> Path:
        return self.path("llama-server")

    @property
    def bench(self) -> Path:
        return self.path("llama-bench")

    @property
    def quantize(self) -> Path:
        return self.path("llama-quantize")

    def env(self) -> dict[str, str]:
        """The environment to run them in: their shared libraries lie beside them."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            x for x in (str(self.bin_dir), env.get("LD_LIBRARY_PATH", "")) if x
        )
        return env

    def missing(self) -> list[str]:
        return [p for p in PROGRAMS if not os.access(self.path(p), os.X_OK)]


def build_root() -> Path:
    return cache_dir() / "llama.cpp" / LLAMA_SOURCE.version


def find_llama_tools() -> LlamaTools | None:
    """``$SPECSCOPE_LLAMA_BIN`` if set (it must hold all three programs), else a finished build
    of :data:`LLAMA_SOURCE` in the cache, else None."""
    if os.environ.get(BIN_ENV):
        tools = LlamaTools(Path(os.environ[BIN_ENV]).expanduser(), "")
        if tools.missing():
            raise LlamaToolsError(
                f"${BIN_ENV}={tools.bin_dir} lacks {', '.join(tools.missing())};"
                f" it must hold {', '.join(PROGRAMS)}"
            )
        return tools
    root = build_root()
    tools = LlamaTools(root / "build" / "bin", LLAMA_SOURCE.version)
    if _built_with_these_flags(root / BUILD_MARKER) and not tools.missing():
        return tools
    return None


def _built_with_these_flags(marker: Path) -> bool:
    """Whether a finished build's marker records today's cmake flags (a build made with other
    flags, e.g. before AMX was left out, is built again)."""
    try:
        return json.loads(marker.read_text()).get("cmake_flags") == list(CMAKE_FLAGS)
    except (OSError, ValueError, AttributeError):
        return False


def _require_build_tools() -> None:
    missing = [name for name in ("cmake", "ninja") if shutil.which(name) is None]
    if not (
        os.environ.get("CXX")
        or shutil.which("c++")
        or shutil.which("g++")
        or shutil.which("clang++")
    ):
        missing.append("a C++ compiler (c++, g++ or clang++)")
    if missing:
        raise LlamaToolsError(
            f"building llama.cpp needs {', '.join(missing)}; install them "
            f"(e.g. apt-get install cmake ninja-build g++) or set ${BIN_ENV} to "
            "a directory of built llama.cpp programs"
        )


def _run_logged(
    cmd: Sequence[str], log: Path, echo: Callable[[str], None], what: str, cwd: Path | None = None
) -> None:
    """Run ``cmd``, appending its output to ``log`` and echoing ninja's [n/m] progress lines."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd
        )
        last = 0.0
        for line in proc.stdout:
            f.write(line)
            if line.startswith("[") and time.monotonic() - last > 5:  # ninja: [12/220] Building
                echo(f"  {what} {line.split(']', 1)[0]}]")
                last = time.monotonic()
        if proc.wait():
            raise LlamaToolsError(f"{what} failed (exit {proc.returncode}); see {log}")


def build_llama_tools(echo: Callable[[str], None] = print, jobs: int | None = None) -> LlamaTools:
    """llama-server, llama-bench and llama-quantize of :data:`LLAMA_SOURCE`, built once into the
    cache (minutes on a small CPU); a finished build is returned at once."""
    found = find_llama_tools()
    if found is not None:
        return found
    _require_build_tools()
    root = build_root()
    with _build_lock(root, echo):
        return find_llama_tools() or _build(root, echo, jobs)


@contextmanager
def _build_lock(root: Path, echo: Callable[[str], None]) -> Iterator[None]:
    """Hold the build directory's lock: a second build started meanwhile (another command, or a
    test beside a background build) waits for the first, then finds its programs."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"waiting for another build of llama.cpp's programs in {root} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build(root: Path, echo: Callable[[str], None], jobs: int | None) -> LlamaTools:
    version = LLAMA_SOURCE.version
    log = root / "build.log"
    source = root / f"llama_cpp_python-{version}"
    if not (source / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        echo(
            f"downloading llama.cpp {LLAMA_SOURCE.build} (the source that llama-cpp-python "
            f"{version} vendors) ..."
        )
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            _run_logged(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    LLAMA_SOURCE.requirement,
                    "-d",
                    tmp,
                ],
                log,
                echo,
                "pip download",
            )
            archives = list(Path(tmp).glob("*.tar.gz"))
            if not archives:
                raise LlamaToolsError(
                    f"pip downloaded no source archive of llama-cpp-python {version}; see {log}"
                )
            digest = _sha256(archives[0])
            if digest != LLAMA_SOURCE.sha256:
                raise LlamaToolsError(
                    f"{archives[0].name} has sha256 {digest}, not the pinned "
                    f"{LLAMA_SOURCE.sha256}; not built"
                )
            with tarfile.open(archives[0]) as tar:
                tar.extractall(root, filter="data")
        if not (source / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            raise LlamaToolsError(
                f"the llama-cpp-python {version} source has no vendored "
                f"llama.cpp at {source / 'vendor' / 'llama.cpp'}"
            )
    build = root / "build"
    echo(f"building {', '.join(PROGRAMS)} (log: {log}) ...")
    _run_logged(
        [
            "cmake",
            "-S",
            str(source / "vendor" / "llama.cpp"),
            "-B",
            str(build),
            "-G",
            "Ninja",
            *CMAKE_FLAGS,
        ],
        log,
        echo,
        "cmake configure",
    )
    _run_logged(
        [
            "cmake",
            "--build",
            str(build),
            "-j",
            str(jobs or os.cpu_count() or 1),
            "--target",
            *PROGRAMS,
        ],
        log,
        echo,
        "cmake build",
    )
    tools = LlamaTools(build / "bin", version)
    if tools.missing():
        raise LlamaToolsError(f"the build finished without {', '.join(tools.missing())}; see {log}")
    (root / BUILD_MARKER).write_text(
        json.dumps(
            {
                "version": version,
                "llama_cpp": f"{LLAMA_SOURCE.build} ({LLAMA_SOURCE.commit})",
                "programs": PROGRAMS,
                "cmake_flags": CMAKE_FLAGS,
            }
        )
        + "\n"
    )
    echo(f"built llama.cpp programs in {tools.bin_dir}")
    return tools


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- llama-bench ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchRow:
    """One llama-bench test: ``n_prompt`` tokens processed in one pass after ``n_depth`` tokens
    of context (or ``n_gen`` one-token passes), with its settings and per-repetition times."""

    model: str
    model_type: str
    n_prompt: int
    n_gen: int
    n_depth: int
    n_threads: int
    poll: int
    n_batch: int
    n_ubatch: int
    avg_ns: int
    stddev_ns: int
    samples_ns: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return self.n_prompt or self.n_gen

    @property
    def seconds(self) -> float:
        """Mean seconds of one pass (a generation test's time over its passes)."""
        return self.avg_ns / 1e9 / (1 if self.n_prompt else max(self.n_gen, 1))


def parse_llama_bench(text: str) -> list[BenchRow]:
    """llama-bench's ``-o json`` output (a JSON array of tests)."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as e:
        raise LlamaToolsError(
            f"llama-bench printed no JSON array ({e.msg} at line {e.lineno})"
        ) from None
    if not isinstance(tests, list):
        raise LlamaToolsError("llama-bench's JSON output is not an array of tests")
    rows = []
    for t in tests:
        try:
            rows.append(
                BenchRow(
                    Path(str(t["model_filename"])).name,
                    str(t.get("model_type", "")),
                    int(t["n_prompt"]),
                    int(t["n_gen"]),
                    int(t.get("n_depth", 0)),
                    int(t["n_threads"]),
                    int(t.get("poll", 0)),
                    int(t["n_batch"]),
                    int(t["n_ubatch"]),
                    int(t["avg_ns"]),
                    int(t.get("stddev_ns", 0)),
                    tuple(int(x) for x in t.get("samples_ns") or ()),
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LlamaToolsError(f"a llama-bench test lacks or garbles field {e}") from None
    return rows


@dataclass(frozen=True)
class BenchGrid:
    """What one llama-bench call crosses: every value of every axis (llama-bench runs the
    product), passes of each of ``tokens`` tokens after each ``depths`` tokens of context."""

    threads: tuple[int, ...] = (2,)
    polls: tuple[int, ...] = (50,)
    batches: tuple[int, ...] = (2048,)
    ubatches: tuple[int, ...] = (512,)
    tokens: tuple[int, ...] = tuple(range(1, 9))
    depths: tuple[int, ...] = (192,)
    repetitions: int = 5

    def argv(self, tools: LlamaTools, model: str | Path) -> list[str]:
        def csv(xs):
            return ",".join(str(x) for x in xs)

        return [
            str(tools.bench),
            "-m",
            str(model),
            "-p",
            csv(self.tokens),
            "-n",
            "0",
            "-d",
            csv(self.depths),
            "-t",
            csv(self.threads),
            "--poll",
            csv(self.polls),
            "-b",
            csv(self.batches),
            "-ub",
            csv(self.ubatches),
            "-r",
            str(self.repetitions),
            "-ngl",
            "0",
            "-o",
            "json",
        ]

    @property
    def tests(self) -> int:
        return (
            len(self.threads)
            * len(self.polls)
            * len(self.batches)
            * len(self.ubatches)
            * len(self.tokens)
            * len(self.depths)
        )


def run_llama_bench(
    tools: LlamaTools, model: str | Path, grid: BenchGrid = BenchGrid(), timeout_s: float = 7200.0
) -> list[BenchRow]:
    """llama-bench's timing of one model over ``grid``."""
    if not Path(model).is_file():
        raise LlamaToolsError(f"GGUF file {model} does not exist")
    try:
        done = subprocess.run(
            grid.argv(tools, model),
            capture_output=True,
            text=True,
            env=tools.env(),
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LlamaToolsError(f"llama-bench ran past {timeout_s:.0f} s on {model}") from None
    if done.returncode:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        raise LlamaToolsError(f"llama-bench failed (exit {done.returncode}) on {model}: {tail}")
    return parse_llama_bench(done.stdout)


def quantize(
    tools: LlamaTools,
    source: str | Path,
    out: str | Path,
    qtype: str,
    threads: int = 2,
    allow_requantize: bool = False,
) -> Path:
    """``llama-quantize`` of ``source`` to ``qtype`` (Q8_0, Q4_0, ...); requantising an already
    quantised file needs ``allow_requantize`` (and loses more than quantising F16 would)."""
    out = Path(out)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    argv = [
        str(tools.quantize),
        *(["--allow-requantize"] if allow_requantize else []),
        str(source),
        str(tmp),
        qtype,
        str(threads),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=tools.env(), check=False)
    if done.returncode:
        tmp.unlink(missing_ok=True)
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        raise LlamaToolsError(f"llama-quantize {qtype} of {source} failed: {tail}")
    tmp.replace(out)
    return out
