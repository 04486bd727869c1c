"""The marks that take tests out of the fast subset (``--fast``): each declared in pyproject.toml,
where ``--strict-markers`` makes an undeclared mark an error, and each explained on the
contributing page."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from conftest import NOT_FAST

ROOT = Path(__file__).resolve().parents[1]


def pytest_options() -> dict:
    """pyproject.toml's [tool.pytest.ini_options]."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def test_every_mark_outside_the_fast_subset_is_declared_and_described():
    options = pytest_options()
    marks = dict(m.split(": ", 1) for m in options["markers"])
    assert set(NOT_FAST) <= set(marks), set(NOT_FAST) - set(marks)
    assert all(marks[m].strip() for m in NOT_FAST)
    assert "--strict-markers" in options["addopts"].split()


def test_the_contributing_page_explains_every_mark():
    page = (ROOT / "docs" / "contributing.md").read_text()
    rows = set(re.findall(r"^\| `([a-z0-9]+)` \|", page, flags=re.M))
    assert rows == set(NOT_FAST), rows ^ set(NOT_FAST)
    assert "python -m pytest --fast" in page
