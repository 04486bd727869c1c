"""specscope.heap: glibc's malloc tuned once per process, the user's own settings kept. Its effect
on a long run (flat memory instead of growth until the kernel kills it) is measured in
BENCHMARKS.md; here, what it sets and when it does nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

IS_GLIBC = (
    os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc") if sys.platform == "linux" else False
)
PROBE = "from specscope.heap import bound_heap_growth as b; print(b(), b())"


def run_probe(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not IS_GLIBC, reason="glibc only: elsewhere the function does nothing")
def test_glibc_gets_a_fixed_mmap_threshold_once_per_process():
    assert run_probe({}) == "True True"  # set once, the second call the cached answer


@pytest.mark.parametrize("name", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_the_users_own_malloc_settings_are_kept(name):
    assert run_probe({name: "131072"}) == "False False"


def test_measurement_and_the_command_line_bound_the_heap():
    """Both ways in: run_study (library users) and the CLI's callback (every command)."""
    import importlib
    import inspect

    cli_app = importlib.import_module("specscope.cli.app")
    study = importlib.import_module("specscope.run.study")

    assert "bound_heap_growth()" in inspect.getsource(study.run_study)
    assert "bound_heap_growth()" in inspect.getsource(cli_app.main)
