"""A newcomer's path: the README's two blocks (the main job, the tests), and the first command
of each "I want to..." row as its docs page writes it, run through the command line.

A docs page marks its first command with an HTML comment before a fenced block,
``<!-- newcomer: NAME -->``, and each input file the command reads with
``<!-- newcomer-file: FILE -->`` before the block that holds the file. The tests read the commands
and files from the pages themselves, so a page that changes its command changes what is run here.
Each command runs in a fresh directory through ``python -m specscope.cli`` (a process of its own,
as a user runs it), on tiny offline inputs where the command allows it: the tiny random pair of
tests/conftest.py stands for "my pair", a synthetic run for a measured one. Commands that need the
demo pair's weights are marked ``weights``; what needs a network or a GPU is named in a skip.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_LIMIT = 10_000
BLOCK = r"```\w*\n(?P<body>.*?)\n```"
CPU_INDEX = ("--index-url", "https://download.pytorch.org/whl/cpu")  # torch's CPU build
COMMAND_MARK = re.compile(r"<!-- newcomer: (?P<name>[\w-]+) -->\n" + BLOCK, re.S)
FILE_MARK = re.compile(r"<!-- newcomer-file: (?P<name>[\w.-]+) -->\n" + BLOCK, re.S)
ROW = re.compile(
    r"^\| (?P<want>[^|`]+?) \| `(?P<command>[^`]+)` \| \[[^]]+\]\((?P<page>[^)]+)\) \|$"
)
ROWS = {  # every row the README must offer, by the name its page marks the first command with
    "measure": "measure my pair on my prompts",
    "paper": "re-test the paper",
    "deploy": "choose and deploy a policy on llama.cpp / vLLM / SGLang",
    "ingest": "read engine logs",
    "sweep": "run a sweep on Ray",
    "certify": "certify acceptance",
}


@dataclass(frozen=True)
class Row:
    """One row of the README's "I want to..." table."""

    want: str
    command: str  # as the README shows it
    page: Path


@dataclass(frozen=True)
class Guide:
    """A docs page's marked first command and the input files it shows."""

    name: str
    commands: tuple[str, ...]  # the marked block's, the first command first
    files: dict[str, str]

    @property
    def command(self) -> str:
        return self.commands[0]


def commands(block: str) -> list[str]:
    """The commands of a fenced shell block: its lines that are not comments, comments cut."""
    return [
        shlex.join(shlex.split(line, comments=True))
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def readme_blocks() -> list[str]:
    """The README's fenced blocks, in order: the main job's first, the tests' second."""
    return [m["body"] for m in re.finditer(BLOCK, README.read_text(encoding="utf-8"), re.S)]


def without_cpu_index(command: str) -> list[str]:
    """A command's words less the option that picks torch's CPU index (the README names it for
    an ordinary machine; CI's pip may find the same pinned build without it)."""
    words = shlex.split(command)
    for i in range(len(words) - 1):
        if (words[i], words[i + 1]) == CPU_INDEX:
            return words[:i] + words[i + 2 :]
    return words


def readme_rows() -> list[Row]:
    text = README.read_text(encoding="utf-8").split("## I want to...", 1)[1]
    rows = [ROW.match(line) for line in text.splitlines() if line.startswith("| ")]
    return [Row(m["want"], m["command"], (README.parent / m["page"]).resolve()) for m in rows if m]


def guide(page: Path) -> Guide:
    text = page.read_text(encoding="utf-8")
    marks = COMMAND_MARK.findall(text)
    assert len(marks) == 1, f"{page}: one <!-- newcomer: NAME --> block, found {len(marks)}"
    name, body = marks[0]
    return Guide(name, tuple(commands(body)), dict(FILE_MARK.findall(text)))


def guides() -> dict[str, Guide]:
    found = {g.name: g for g in (guide(row.page) for row in readme_rows())}
    assert sorted(found) == sorted(ROWS)
    return found


def ci_commands() -> list[str]:
    """.ci/run's install and test commands."""
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return [
        line for line in lines if line.startswith(("python -m pip install", "python -m pytest"))
    ]


def run_cli(command: str, cwd: Path, replace: dict[str, str] | None = None, timeout: int = 600):
    """Run a ``specscope ...`` command line in ``cwd``, words of ``replace`` substituted."""
    argv = [(replace or {}).get(word, word) for word in shlex.split(command)]
    assert argv[0] == "specscope", command
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-m", "specscope.cli", *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done


def write_files(files: dict[str, str], cwd: Path) -> None:
    for name, body in files.items():
        (cwd / name).write_text(body + "\n", encoding="utf-8")


# --- the README --------------------------------------------------------------------------------


def test_the_readme_is_at_most_10000_characters():
    assert len(README.read_text(encoding="utf-8")) <= README_LIMIT


def test_the_readmes_first_block_is_the_main_job_and_the_second_is_what_ci_runs():
    main_job, tests = (commands(block) for block in readme_blocks()[:2])
    assert any(line.startswith("specscope run --config demo") for line in main_job)
    assert all(" && " not in line for line in main_job + tests)  # one command a line
    ci = [part for line in ci_commands() for part in line.split(" && ")]
    assert [without_cpu_index(line) for line in tests] == [without_cpu_index(c) for c in ci]


def test_every_row_shows_its_guides_first_command():
    rows = readme_rows()
    assert sorted(row.want for row in rows) == sorted(ROWS.values())
    for row in rows:
        page = guide(row.page)
        assert ROWS[page.name] == row.want
        assert shlex.split(row.command) == shlex.split(page.command)


@pytest.mark.weights
def test_the_readmes_main_job(tmp_path):
    """The README's main job after its clone and installs (the test runs in an installed checkout)."""
    steps = [shlex.split(line) for line in commands(readme_blocks()[0])]
    programs = [argv[0] for argv in steps]
    assert programs == ["git", "cd", "pip", "pip", "specscope", "specscope", "specscope"]
    for argv in steps[4:]:
        run_cli(shlex.join(argv), tmp_path, timeout=3600)
    assert (tmp_path / "runs" / "demo" / "analysis").is_dir()
    assert (tmp_path / "runs" / "demo" / "certify").is_dir()


# --- the guides' first commands ------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_dirs):
    """The measure guide's first command, in a fresh directory, on the tiny pair: (dir, run)."""
    cwd = tmp_path_factory.mktemp("newcomer")
    page = guides()["measure"]
    write_files(page.files, cwd)
    pair = {
        "my-draft": str(tiny_dirs["qwen2", "draft"]),
        "my-target": str(tiny_dirs["qwen2", "target"]),
    }
    run_cli(page.command, cwd, pair)
    return cwd, cwd / shlex.split(page.command)[-1]


def test_measure_my_pair_on_my_prompts(measured):
    from specscope.records import load_run

    _, run_dir = measured
    run = load_run(run_dir)
    assert sorted(run.prompts["prompt_id"]) == ["q1", "q2"]
    assert len(run.nodes) > 0


def test_choose_and_deploy_a_policy(measured):
    """deploy's first command tunes the measured run (the tiny pair's costs timed here); its
    second exports the policy for an engine."""
    import json

    cwd, _ = measured
    tune, export = guides()["deploy"].commands
    run_cli(tune, cwd)
    policy = json.loads((cwd / shlex.split(tune)[-1]).read_text())
    assert set(policy["domains"]) <= {"code", "math", "reasoning", "chat"}
    run_cli(export, cwd)
    assert json.loads((cwd / shlex.split(export)[-1]).read_text())["domains"]


def test_read_engine_logs(tmp_path):
    import pandas as pd

    page = guides()["ingest"]
    write_files(page.files, tmp_path)
    run_cli(page.command, tmp_path)
    steps = pd.read_parquet(tmp_path / shlex.split(page.command)[-1] / "steps.parquet")
    assert steps["tau"].tolist() == [2, 2, 2, 1]  # the page's line: 1, 1, 1 and 0 accepted


def test_run_a_sweep(tmp_path):
    page = guides()["sweep"]
    write_files(page.files, tmp_path)
    done = run_cli(page.command, tmp_path)
    assert "12 grid point(s)" in done.stdout


def test_certify_acceptance(tmp_path):
    """certify's first command on a synthetic run where the page has a measured one."""
    from lab.synthetic import write_synthetic_run

    command = guides()["certify"].command
    run_dir, out = shlex.split(command)[2], shlex.split(command)[-1]
    write_synthetic_run(tmp_path / run_dir, prompts_per_domain=3, steps=(4, 8))
    run_cli(command, tmp_path)
    assert (tmp_path / out / "certified_by_margin.csv").is_file()


@pytest.mark.weights
def test_re_test_the_paper(tmp_path):
    """The paper guide's first command on the demo pair, cut to 1 prompt per domain and 4 tokens
    (the whole study takes about 35 minutes on 2 CPU cores; the options only change its size)."""
    command = guides()["paper"].command
    run_cli(command + " --per-domain 1 --max-new-tokens 4", tmp_path, timeout=3600)
    assert (tmp_path / shlex.split(command)[-1] / "nodes.parquet").is_file()


def test_the_paper_on_its_own_pair_needs_a_network_and_gpus():
    pytest.skip(
        "network and GPU: `specscope run --config paper` (docs/guides/paper.md) loads "
        "TinyLlama-1.1B-Chat and a GPTQ Llama-2-7B-Chat from the Hugging Face hub"
    )


def test_a_sweep_on_a_ray_cluster_needs_a_cluster():
    pytest.skip(
        "network: `specscope sweep SWEEP.toml --executor ray --address auto` "
        "(docs/guides/sweep.md) needs a running Ray cluster"
    )
