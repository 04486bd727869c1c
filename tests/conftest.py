"""Shared test helpers: the tiny saved pairs (``specscope.models.tiny``'s random models and byte
tokenizer), run configs over them, records read back without their timings.

Where a new test goes: a bug a user hit (a case a careful user tried; the comment says what
happened before) -> test_safety.py, or test_abuse_*.py for hostile input; otherwise the file named
after the package or module it tests: core/ -> test_core.py, decode.py -> test_decode.py,
measure/ -> test_measure.py, run/ -> test_run.py, sweep/ -> test_sweep.py, tune/ -> test_tune.py,
models/ -> test_models.py, trees.py -> test_trees.py, theory/ -> test_theory.py, and so on.

The fast subset is ``python -m pytest --fast``: every test without one of the marks in NOT_FAST
(pyproject.toml says what each means; docs/contributing.md how long each set takes). A test that
takes more than a few seconds on 2 CPU cores carries one of them. After a test of the real
weights, garbage is collected and freed heap pages are handed back to the system (release_memory);
at the end of every other test file only the pages are, so that one file's models do not stay
resident under the next one's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from specscope.models import PairConfig
from specscope.models.tiny import byte_tokenizer, tiny_model
from specscope.records import TIMING_COLUMNS, load_run
from specscope.run.config import PromptSpec, RunConfig
from specscope.trees import TreeConfig

# the marks that take a test out of the fast subset (``--fast``); pyproject.toml defines each
NOT_FAST = ("slow", "int8", "calibration", "weights", "llamacpp")


def pytest_addoption(parser):
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"run only the fast subset: leave out the tests marked {', '.join(NOT_FAST)}",
    )


def pytest_collection_modifyitems(config, items):
    """With ``--fast``, deselect (and count as deselected) every test carrying a NOT_FAST mark.
    Otherwise the ``llamacpp`` tests go last, and where llama.cpp's programs are not built yet
    their build starts now in the background (:func:`_start_llama_build`)."""
    if config.getoption("fast"):
        fast = [item for item in items if not any(item.get_closest_marker(m) for m in NOT_FAST)]
        if len(fast) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in fast])
            items[:] = fast
        return
    items.sort(key=lambda item: item.get_closest_marker("llamacpp") is not None)  # stable
    if items and items[-1].get_closest_marker("llamacpp"):
        _start_llama_build()


_LLAMA_BUILD: list[subprocess.Popen] = []


def _can_build_llama() -> bool:
    """Whether llama.cpp's programs are missing and this machine has what building them takes."""
    import shutil

    from specscope.serving.llamacpp.programs import LlamaToolsError, find_llama_tools

    try:
        if find_llama_tools() is not None:
            return False
    except LlamaToolsError:  # $SPECSCOPE_LLAMA_BIN names an incomplete directory
        return False
    return bool(shutil.which("cmake") and (shutil.which("c++") or shutil.which("g++")))


def _start_llama_build() -> None:
    """Build llama.cpp's programs (about 14 minutes of one core) in a child process, one
    compiler at a time at the lowest CPU priority, while the other tests run: they take about
    one core of two, and the build the rest. The first ``llamacpp`` test waits for it on the
    build's lock (:func:`llama_tools`)."""
    import os

    if not _can_build_llama():
        return
    code = (
        "from specscope.serving.llamacpp.programs import build_llama_tools\n"
        "build_llama_tools(echo=lambda line: None, jobs=1)"
    )
    _LLAMA_BUILD.append(
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: os.nice(19),  # noqa: PLW1509 (no threads yet at collection)
            start_new_session=True,
        )
    )


def pytest_sessionfinish(session, exitstatus):
    """Stop a background build that outlived the session (e.g. ``-x`` stopped it early)."""
    import os
    import signal

    for proc in _LLAMA_BUILD:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()


def llama_tools():
    """llama.cpp's programs for a test: found, or built (after the background build, if one is
    under way); the test is skipped, saying why, where they cannot be had."""
    from specscope.serving.llamacpp.programs import (
        LlamaToolsError,
        build_llama_tools,
        find_llama_tools,
    )

    try:
        if (tools := find_llama_tools()) is not None:
            return tools
    except LlamaToolsError as e:
        pytest.skip(str(e))
    if not _can_build_llama():
        pytest.skip(
            "llama.cpp's programs are not built and cmake or a C++ compiler is missing to build "
            "them (or set SPECSCOPE_LLAMA_BIN to a directory of built llama.cpp programs)"
        )
    try:
        return build_llama_tools(echo=lambda line: None)
    except LlamaToolsError as e:
        pytest.skip(f"llama.cpp's programs could not be built here: {e}")


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    libc = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None


def trim_heap() -> None:
    """Return the heap's free pages to the system where the C library can (malloc_trim)."""
    if (trim := _malloc_trim()) is not None:
        trim(0)


def release_memory() -> None:
    """Collect reference cycles (about 0.2 s with torch and transformers loaded), then trim."""
    gc.collect()
    trim_heap()


_DEMO_CACHE_BUILT = []


def pytest_runtest_setup(item):
    """Before the first test of the real weights, build the demo pair's bf16 cache and its int8
    cache in child processes: on a cold cache (CI) the GGUF-to-bf16 conversion, the float32 load
    and the quantisation would otherwise run inside pytest, and the memory they take would stay in
    this process under every later test (tests/test_demo_pair.py then loads the int8 pair from its
    cache). Its failure (no demo extra) is left to the tests themselves, which skip or say why."""
    if _DEMO_CACHE_BUILT or not item.get_closest_marker("weights"):
        return
    _DEMO_CACHE_BUILT.append(True)
    # one process per step, so that each step's memory is the largest a process holds: the bf16
    # conversion, then each model's float32 load and quantisation alone
    steps = [
        "from specscope.models.demo import demo_checkpoint\n"
        "for role in ('draft', 'target'): demo_checkpoint(role)",
        *(
            "from specscope.models.load import load_model\n"
            f"load_model('demo:{role}', 'float32', quantize='int8')"
            for role in ("target", "draft")
        ),
    ]
    for step in steps:
        subprocess.run([sys.executable, "-c", step], check=False, capture_output=True, timeout=3600)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the fixtures of ``item`` are torn down: release memory after a test of the real
    weights; trim the heap at the end of any other file (its module fixtures are gone; the tiny
    models are freed without a collection)."""
    result = yield
    if item.get_closest_marker("weights"):
        release_memory()
    elif nextitem is None or nextitem.path != item.path:
        trim_heap()
    return result


def rate_at_most(count: int, trials: int, confidence: float = 0.95) -> float:
    """The one-sided upper bound (Clopper-Pearson, exact binomial) of a rate seen ``count`` times
    in ``trials`` independent simulated worlds. A calibration test that asserts this bound, not
    the share itself, shows its rate below the limit with few worlds: 0 of 59 bounds it at 5%."""
    from scipy.stats import binomtest

    ci = binomtest(count, trials, alternative="less").proportion_ci(confidence, method="exact")
    return float(ci.high)


def write_prompts(path, count: int = 3, domains: tuple[str, ...] = ("code", "chat")):
    """A JSONL prompts file of ``count`` short questions, ids p0.., domains taken in turn."""
    lines = [
        {"id": f"p{i}", "domain": domains[i % len(domains)], "prompt": f"Question {i}: why?"}
        for i in range(count)
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


@pytest.fixture
def prompt_file(tmp_path):
    """Three prompts, code and chat in turn (test files with other needs define their own)."""
    return write_prompts(tmp_path / "prompts.jsonl")


def run_config(
    tiny_dirs, prompts, arch: str = "qwen2", pair: dict | None = None, **fields
) -> RunConfig:
    """A run of the tiny saved ``arch`` pair in float32 over the JSONL file ``prompts``: the paper
    tree and 12 new tokens unless ``fields`` say otherwise; ``pair`` overrides [pair] fields."""
    pair_config = PairConfig(
        draft=str(tiny_dirs[arch, "draft"]),
        target=str(tiny_dirs[arch, "target"]),
        **{"dtype": "float32", **(pair or {})},
    )
    return RunConfig(
        **{
            "pair": pair_config,
            "tree": TreeConfig(policy="paper"),
            "prompts": PromptSpec(file=str(prompts)),
            "max_new_tokens": 12,
            **fields,
        }
    )


# the smallest run a user-story test needs: a chain of 2, 3 new tokens, no certificates
small_run_config = functools.partial(
    run_config, tree=TreeConfig(policy="chain", depth=2), max_new_tokens=3, criteria=None
)


def tiny_pair_args(tiny_dirs, arch: str = "qwen2") -> list[str]:
    """The command-line options that pick a tiny pair of ``tiny_dirs`` in float32."""
    return [
        "--draft",
        str(tiny_dirs[arch, "draft"]),
        "--target",
        str(tiny_dirs[arch, "target"]),
        "--dtype",
        "float32",
    ]


def interrupt_at_prompt(monkeypatch, n: int):
    """Make measurement raise KeyboardInterrupt as its ``n``-th prompt finishes, before that
    prompt is committed; returns the function that puts measurement back."""
    from specscope.measure import study as measure_study

    real = measure_study.finish_prompt
    calls = {"n": 0}

    def dies(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(measure_study, "finish_prompt", dies)
    return lambda: monkeypatch.setattr(measure_study, "finish_prompt", real)


def read_records(run_dir):
    """A run's node, step and prompt tables without their timing columns."""
    run = load_run(run_dir)
    return [
        t.drop(columns=[c for c in TIMING_COLUMNS if c in t]).reset_index(drop=True)
        for t in (run.nodes, run.steps, run.prompts)
    ]


@pytest.fixture(scope="session")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def arch(request):
    return request.param


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tokenizer):
    """Saved tiny draft/target checkpoints per architecture, loadable like any local model."""
    dirs = {}
    for arch in ("llama", "qwen2"):
        for role, seed, layers in (("draft", 1, 1), ("target", 2, 2)):
            path = tmp_path_factory.mktemp(f"{arch}-{role}")
            tiny_model(arch, len(tokenizer), seed, layers).save_pretrained(path)
            tokenizer.save_pretrained(path)
            dirs[arch, role] = path
    return dirs


# the local hub's model: its branch main and tag v2, at two commits of different weights and depth
HUB_MODEL = "org/tiny"
HUB_COMMITS = {"main": "a" * 40, "v2": "b" * 40}


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory, tokenizer):
    """A Hugging Face hub cache (``models--org--tiny/refs/REF`` holding a commit,
    ``snapshots/COMMIT/`` its files, in place of the links to blobs a download leaves) holding
    :data:`HUB_MODEL` at :data:`HUB_COMMITS`: main a 1-layer tiny qwen2, v2 a 2-layer one."""
    root = tmp_path_factory.mktemp("hub")
    repo = root / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    for layers, (ref, commit) in enumerate(HUB_COMMITS.items(), start=1):
        snapshot = repo / "snapshots" / commit
        tiny_model("qwen2", len(tokenizer), seed=layers, layers=layers).save_pretrained(snapshot)
        tokenizer.save_pretrained(snapshot)
        (repo / "refs" / ref).write_text(commit)
    return root


@pytest.fixture
def local_hub(hub_cache, monkeypatch):
    """:data:`HUB_MODEL` loadable as a hub id, offline, from :func:`hub_cache`: the hub code path
    of ``from_pretrained(HUB_MODEL, revision=...)`` without a network."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return HUB_MODEL


def spine_nodes(rates: dict[str, list[float]], prompts: int = 4, steps: int = 50):
    """A spine of depth D per step whose top-1 node at depth d is accepted with the given
    rate (deterministically: the first round(rate * steps) steps of each prompt)."""
    rows = []
    for domain, r in rates.items():
        for p in range(prompts):
            for s in range(steps):
                for d, rate in enumerate(r, start=1):
                    rows.append(
                        {
                            "prompt_id": f"{domain}{p}",
                            "domain": domain,
                            "step": s,
                            "node_id": d - 1,
                            "parent_id": d - 2,
                            "depth": d,
                            "sibling_rank": 0,
                            "greedy_accept": s < round(rate * steps),
                        }
                    )
    import pandas as pd

    return pd.DataFrame(rows)


def steps_of(nodes: pd.DataFrame) -> pd.DataFrame:
    """The step records that node records imply (accepted_len: the deepest accepted path)."""
    from specscope.records import tree_paths

    nodes = nodes.sort_values(["prompt_id", "step", "node_id"], kind="stable")
    first = nodes.groupby(["prompt_id", "step"]).cumcount().to_numpy()
    parent = nodes["parent_id"].to_numpy()
    row = np.where(parent < 0, -1, np.arange(len(nodes)) - first + parent)
    depth = nodes["depth"].to_numpy()
    paths = tree_paths(
        nodes["greedy_accept"].to_numpy(bool),
        depth,
        nodes["sibling_rank"].to_numpy(),
        parent < 0,
        row,
    )
    nodes = nodes.assign(accepted_len=np.where(paths.accepted, depth, 0))
    keys = ["prompt_id", "domain", "step"]
    steps = nodes.groupby(keys, as_index=False).agg(
        accepted_len=("accepted_len", "max"), tree_size=("node_id", "size")
    )
    return steps.assign(tau=steps.accepted_len + 1)
