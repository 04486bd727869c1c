"""The report shows before it tells: the claims' forest plot and tokens per step come first, one
line per claim follows, and every table is folded in a closed <details>.

The layout in a real browser (what a 1280x800 first screen holds) is checked by
``scripts/check_report_chromium.sh`` through ``test_report_renders_in_headless_chromium`` in
``tests/test_analysis.py``; these tests check the plots' content and the page's structure.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from lab.synthetic import write_synthetic_run
from specscope.analysis import analyze
from specscope.analysis.findings import Verdict
from specscope.analysis.prepare import ALL
from specscope.analysis.render import Column, Grid, analysis_grids
from specscope.analysis.report import CLAIM_GRIDS, RUN_SECTIONS, write_outputs, write_report
from specscope.analysis.results import Settings


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    run = write_synthetic_run(
        tmp_path_factory.mktemp("first") / "run", prompts_per_domain=12, steps=(10, 40), seed=3
    )
    return analyze(run, Settings(n_boot=100, seed=0))


class _Page(HTMLParser):
    """The order of the page's landmarks, and whether each table lies inside a <details>."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []  # (tag, id or alt)
        self.details = 0
        self.open_details = 0
        self.unfolded_tables: list[str] = []
        self.claims: list[str] = []  # the class of each claim line's verdict
        self._in_claims = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "details":
            self.details += 1
            self.open_details += "open" in a
        elif tag == "table":
            self.events.append(("table", a.get("id") or ""))
            if not self.details:
                self.unfolded_tables.append(a.get("id") or "")
        elif tag == "img":
            self.events.append(("img", a.get("alt") or ""))
        elif tag in ("figure", "section", "div", "ul") and a.get("id"):
            self.events.append((tag, a["id"]))
        if tag == "ul" and a.get("class") == "claims":
            self._in_claims = True
        elif tag == "span" and self._in_claims:
            self.claims.append(a.get("class") or "")

    def handle_endtag(self, tag):
        if tag == "details":
            self.details -= 1
        elif tag == "ul":
            self._in_claims = False


def _parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    return parser


def _index(events: list[tuple[str, str]], event: tuple[str, str]) -> int:
    return events.index(event)


def test_forest_plot_draws_each_claims_figures_in_its_verdicts_colour(synthetic):
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_hex

    from specscope.analysis.plots import (
        VERDICT_COLOURS,
        VERDICT_MARKERS,
        claim_references,
        forest_plot,
    )

    fig = forest_plot(synthetic)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == len(synthetic.findings)
    for ax, f in zip(panels, synthetic.findings):
        assert ax.get_title(loc="left").replace("\n", " ").endswith(f.verdict.value)
        points = [line for line in ax.lines if line.get_marker() in ("o", "X", "D")]
        defined = [e for _, e in f.figures if e.defined]
        if not defined:
            assert not points
            continue
        (line,) = points
        assert to_hex(line.get_color()) == VERDICT_COLOURS[f.verdict]
        marker, filled = VERDICT_MARKERS[f.verdict]
        assert line.get_marker() == marker
        assert to_hex(line.get_markerfacecolor()) == (
            VERDICT_COLOURS[f.verdict] if filled else "#ffffff"
        )
        # top to bottom in the finding's order: the first figure has the highest y
        xs = np.asarray(line.get_xdata(), dtype=float)
        expected = np.array([e.value for _, e in f.figures], dtype=float)
        np.testing.assert_allclose(xs, expected)
        refs = [
            line.get_xdata()[0]
            for line in ax.lines
            if line.get_linestyle() == "--" and line.get_marker() != "o"
        ]
        assert refs == list(claim_references(f.key)), f.key
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:4] == [v.value for v in Verdict]


def test_forest_plot_says_why_a_claim_has_no_figure(tmp_path):
    pytest.importorskip("matplotlib")
    from lab.synthetic import PROFILES
    from specscope.analysis.plots import forest_plot

    profiles = {d: p for d, p in PROFILES.items() if d != "chat"}
    run = write_synthetic_run(tmp_path / "run", prompts_per_domain=3, steps=8, profiles=profiles)
    a = analyze(run, Settings(n_boot=20, seed=0))
    paradox = next(f for f in a.findings if f.key == "chat_paradox")
    assert paradox.verdict == Verdict.UNTESTABLE and not paradox.figures
    fig = forest_plot(a)
    ax = [ax for ax in fig.axes if ax.get_visible()][list(a.findings).index(paradox)]
    assert not [line for line in ax.lines if line.get_marker() in ("o", "X", "D")]
    assert [t.get_text() for t in ax.texts] == [paradox.detail]


def test_claim_references_are_the_claims_thresholds():
    from specscope.analysis.plots import claim_references

    assert claim_references("only_chat_above_one") == (1.0,)
    assert claim_references("below_one_no_speedup") == (1.0,)
    assert claim_references("rho_negative") == (0.0,)
    assert claim_references("rises_with_depth_top1_chain") == (0.0,)
    assert claim_references("task_type_over_depth_greedy") == (0.0,)
    assert claim_references("rho_weak_range") == (-0.3, -0.1)
    assert claim_references("a claim of someone else") == ()


def test_tokens_per_step_plot_shows_decoded_tokens_per_step(synthetic):
    """The first screen's tokens per step are decoding's (the recorded trees replayed), labelled
    so; an analysis without them (``delivered`` None) shows the position mean, labelled so."""
    pytest.importorskip("matplotlib")
    from dataclasses import replace

    from specscope.analysis.plots import (
        DECODED_TOKENS_PER_STEP,
        TOKENS_PER_STEP,
        tokens_per_step_plot,
    )

    ax = tokens_per_step_plot(synthetic).axes[0]
    assert DECODED_TOKENS_PER_STEP in ax.get_ylabel()
    rows = [r for r in synthetic.delivered.decoded.rows if r.steps > 0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [r.domain for r in rows]
    points = [line for line in ax.lines if line.get_marker() == "o"]
    assert [float(line.get_ydata()[0]) for line in points] == [r.decoded.value for r in rows]
    assert rows[-1].domain == ALL and points[-1].get_color() == "black"

    ax = tokens_per_step_plot(replace(synthetic, delivered=None)).axes[0]
    assert (
        TOKENS_PER_STEP == "tokens per step (position mean)" and TOKENS_PER_STEP in ax.get_ylabel()
    )
    rows = [r for r in synthetic.tau if r.steps > 0]
    points = [line for line in ax.lines if line.get_marker() == "o"]
    assert [float(line.get_ydata()[0]) for line in points] == [r.tau.value for r in rows]


def test_the_page_opens_with_the_plots_and_folds_every_table(synthetic, tmp_path):
    out = write_outputs(synthetic, tmp_path / "analysis")
    page = _parse(out.html.read_text())
    events = page.events
    first_table = next(i for i, (tag, _) in enumerate(events) if tag == "table")
    if out.plots:
        forest = _index(events, ("figure", "r0-plot-claims_forest"))
        tokens = _index(events, ("figure", "r0-plot-tokens_per_step"))
        assert forest < tokens < _index(events, ("ul", "r0-claims")) < first_table
        assert events[forest + 1][0] == "img" and events[forest + 1][1]  # with alt text
        drawn = [e for e in events if e[0] == "figure" and e[1].startswith("r0-plot-")]
        assert len(drawn) == len(out.plots)  # the other plots follow, shown (not folded)
    assert page.unfolded_tables == [] and page.open_details == 0
    assert len(page.claims) == len(synthetic.findings)
    verdict_class = {
        Verdict.HOLDS: "v-holds",
        Verdict.FAILS: "v-fails",
        Verdict.INCONCLUSIVE: "v-inconclusive",
        Verdict.UNTESTABLE: "v-untestable",
    }
    assert page.claims == [verdict_class[f.verdict] for f in synthetic.findings]
    # every table of the analysis is on the page, and the run's information comes last
    ids = [i for tag, i in events if tag == "table"]
    assert {f"r0-{g.key}" for g in analysis_grids(synthetic)} <= set(ids)
    parts = [i.removeprefix("r0-part-") for tag, i in events if i.startswith("r0-part-")]
    named = [s.key for s in RUN_SECTIONS]
    assert [k for k in parts if k in named] == [k for k in named if k in parts]
    assert parts[-3:] == ["paper", "prompts", "info"] and ids[-1] == "r0-info"


def test_a_grid_no_section_names_is_still_shown_folded(synthetic, tmp_path, monkeypatch):
    from specscope.analysis import report

    extra = Grid("someone_new", "A new result", (Column("Domain"), Column("Value")), (("x", 1),))
    monkeypatch.setattr(report, "analysis_grids", lambda a: analysis_grids(a) + [extra])
    page = write_report([synthetic], tmp_path / "r.html", plots=False).read_text()
    parsed = _parse(page)
    assert ("table", "r0-someone_new") in parsed.events and parsed.unfolded_tables == []
    assert 'id="r0-part-other"' in page and "A new result" in page
    assert set(CLAIM_GRIDS) & {s for sec in RUN_SECTIONS for s in sec.grids} == set()


def test_without_plots_the_claims_still_come_first(synthetic, tmp_path):
    page = write_report([synthetic], tmp_path / "r.html", plots=False).read_text()
    parsed = _parse(page)
    first_table = next(i for i, (tag, _) in enumerate(parsed.events) if tag == "table")
    assert _index(parsed.events, ("ul", "r0-claims")) < first_table
    assert "plots not requested" in page and "data:image/png" not in page
    assert len(parsed.claims) == len(synthetic.findings)


def test_a_comparison_folds_its_tables_and_keeps_one_first_screen_per_run(synthetic, tmp_path):
    pytest.importorskip("matplotlib")
    page = write_report([synthetic, synthetic], tmp_path / "c.html").read_text()
    parsed = _parse(page)
    assert parsed.unfolded_tables == []
    ids = [i for tag, i in parsed.events if tag == "figure"]
    assert {"r0-plot-claims_forest", "r1-plot-claims_forest", "r1-plot-tokens_per_step"} <= set(ids)
    assert len(ids) == len(set(ids))  # figure ids are unique on a page of several runs
    assert page.count('<section id="run-') == 2 and 'id="c0-summary"' in page


def test_docs_screenshot_is_a_small_png():
    png = Path(__file__).resolve().parents[1] / "docs" / "img" / "report-first-screen.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(data) < 400_000


# --- the page and the console answer first ---------------------------------------------------------

DEMO_MANIFEST = {  # what `specscope run` records of the demo pair (results/demo-pair/*/manifest.json)
    "config": {
        "pair": {"draft": "demo:draft", "target": "demo:target", "dtype": "float32"},
        "tree": {"policy": "paper", "top_k": 3, "branch": 2, "depth": 3, "max_nodes": 8},
    },
    "tree": {"nodes_per_depth": [2, 4, 2]},
    "models": {
        role: {
            "source": f"demo:{role}",
            "resolved": f"/root/.cache/specscope/demo/{name}-Q4_K_M-1d9614638d18-bf16",
        }
        for role, name in (
            ("draft", "Qwen2.5-Coder-0.5B-Instruct"),
            ("target", "Qwen2.5-Coder-1.5B-Instruct"),
        )
    },
    "created": "2026-11-24T00:44:54+00:00",
}


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory):
    """A synthetic run whose manifest names the demo pair as a real run's does, analysed from its
    absolute path."""
    import json

    run = write_synthetic_run(
        tmp_path_factory.mktemp("demo") / "demo-run", prompts_per_domain=12, steps=(10, 40), seed=3
    )
    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["config"] = DEMO_MANIFEST["config"]
    manifest.update({k: v for k, v in DEMO_MANIFEST.items() if k != "config"})
    path.write_text(json.dumps(manifest))
    return analyze(run.resolve(), Settings(n_boot=100, seed=0))


def test_the_pair_by_name_titles_the_report(demo_like, tmp_path):
    from specscope.analysis.headline import pair_title, run_subtitle

    pair = "Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct"
    assert pair_title(demo_like.info.manifest) == pair
    subtitle = run_subtitle(demo_like)
    for said in (
        "paper tree (8 nodes, depth 3)",
        "float32",
        "12 prompts per domain (chat, code, math, reasoning)",
        "2026-11-24",
        f"run {demo_like.info.run_id}",
    ):
        assert said in subtitle, said
    page = write_report([demo_like], tmp_path / "r.html", plots=False).read_text()
    assert f"<h1>{pair}</h1>" in page and f"<title>{pair} · specscope</title>" in page
    head = page[page.index("<h1>") : page.index('<section id="run-0"')]
    assert '<p class="subtitle">' in head and "12 prompts per domain" in head
    assert "SVG written" not in page


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("demo:target", "Qwen2.5-Coder-1.5B-Instruct"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("/home/someone/models/Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Llama-3.2-1B-Instruct"),
        ("/srv/models/tiny-llama/", "tiny-llama"),
    ],
)
def test_models_are_named_as_a_user_knows_them(source, name):
    from specscope.analysis.headline import model_name

    assert model_name(source) == name


def test_a_model_free_drafter_and_a_synthetic_run_are_titled_for_what_they_are():
    from specscope.analysis.headline import pair_title

    ngram = {**DEMO_MANIFEST["config"], "drafter": {"kind": "ngram"}}
    assert pair_title({"config": ngram}) == "prompt lookup (n-gram) drafting for " + (
        "Qwen2.5-Coder-1.5B-Instruct"
    )
    assert pair_title({"config": {"synthetic": True}}).startswith("Synthetic run")
    assert pair_title({"run_id": "abc"}) == "Run abc"


def test_no_absolute_path_of_the_making_machine_in_the_outputs(demo_like, tmp_path):
    import re

    from specscope.cache import cache_dir

    assert Path(demo_like.info.path).is_absolute()  # analysed from its absolute path
    out = write_outputs(demo_like, tmp_path / "analysis", plots=False)
    machine = re.compile(r"(?<![\w.])/(?:root|home|tmp|Users|work|srv)/")
    for path in (out.json, out.html, out.markdown, out.latex):
        text = path.read_text()
        assert not machine.search(text), (path.name, machine.search(text))
        assert str(Path(demo_like.info.path)) not in text and str(cache_dir()) not in text
    page = out.html.read_text()
    assert "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M-1d9614638d18-bf16" in page  # the model by name
    assert demo_like.info.manifest["models"]["draft"]["resolved"].startswith("/root/")  # as read


def test_portable_paths_are_relative_or_names(monkeypatch, tmp_path):
    from specscope.analysis.headline import portable_path

    monkeypatch.chdir(tmp_path)
    assert portable_path("results/demo-pair/x") == "results/demo-pair/x"
    assert portable_path(tmp_path / "results" / "run") == "results/run"
    assert portable_path("/elsewhere/runs/run-7") == "run-7"


def _console_lines(run_dir: Path, *args: str) -> list[str]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "120"}
    done = subprocess.run(
        [sys.executable, "-m", "specscope.cli", "analyze", str(run_dir), "--boot", "50",
         "--no-plots", *args],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def test_analyze_prints_tokens_per_step_by_domain_first(tmp_path):
    run = write_synthetic_run(tmp_path / "run", prompts_per_domain=6, steps=(8, 20), seed=1)
    lines = _console_lines(run)
    first = lines[:30]
    assert first[0].startswith("Tokens per step by domain")
    assert any("tokens/step [95% CI]" in line for line in first[:4])
    domains = [line for line in first if line.startswith("│ ")][:5]
    assert [line.split("│")[1].strip() for line in domains] == [
        "chat",
        "code",
        "math",
        "reasoning",
        "All",
    ]
    assert all("[" in line for line in domains)  # with intervals
    text = "\n".join(first)
    assert "Where speculation pays" in text and "Best stop signal" in text
    claims = next(i for i, line in enumerate(lines) if line.startswith("Findings:"))
    assert claims > next(i for i, line in enumerate(lines) if "Best stop signal" in line)


def test_console_grids_order_the_first_screen_the_claims_then_the_tables(synthetic):
    from specscope.analysis.headline import MAIN_TABLES, console_grids
    from specscope.analysis.report import run_grids

    grids = run_grids(synthetic)
    keys = [g.key for g in console_grids(synthetic, grids)]
    assert keys[:3] == ["first_tokens_per_step", "first_where_it_pays", "findings"]
    assert set(keys[3:]) <= set(MAIN_TABLES) and "table1" in keys
    every = [g.key for g in console_grids(synthetic, grids, "all")]
    assert every[:2] == keys[:2] and every[2:] == [g.key for g in grids]
    assert console_grids(synthetic, grids, "none") == []


def test_the_domain_palette_shares_no_colour_with_the_verdicts(synthetic):
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_hex

    from specscope.analysis.plots import (
        DOMAIN_COLOURS,
        VERDICT_COLOURS,
        VERDICT_MARKERS,
        depth_plot,
        tokens_per_step_plot,
    )

    assert not set(DOMAIN_COLOURS) & set(VERDICT_COLOURS.values())
    assert len({m for m, _ in VERDICT_MARKERS.values()}) >= 3  # told apart by shape too
    ax = tokens_per_step_plot(synthetic).axes[0]
    drawn = {to_hex(line.get_color()) for line in ax.lines if line.get_marker() == "o"}
    assert drawn - {"#000000"} <= {c.lower() for c in DOMAIN_COLOURS}
    lines = depth_plot(synthetic).axes[0].lines
    drawn = {to_hex(line.get_color()) for line in lines if line.get_marker() == "o"}
    assert drawn - {"#000000"} <= {c.lower() for c in DOMAIN_COLOURS}
