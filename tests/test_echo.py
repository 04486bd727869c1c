"""Prompt echo (specscope.analysis.echo): the share of output words copied from the prompt, per
prompt on hand-checked texts and per domain with prompt-clustered intervals and warnings."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from specscope.analysis.echo import HIGH_SHARE, WARN_SHARE, echo_table, prompt_echo
from specscope.analysis.stats import ClusterBootstrap

PROMPT = 'def add(a, b):\n    """Return the sum of a and b.\n    >>> add(2, 3)\n    5\n    """'


def test_prompt_echo_counts_words_in_long_enough_copied_runs():
    words = "a b c d e f g h i j"
    e = prompt_echo(words, "c d e f g h i j k", run_words=8)
    assert (e.words, e.copied, e.verbatim) == (9, 8, False)  # c..j copied, k new
    assert e.share == pytest.approx(8 / 9)
    seven = prompt_echo(words, "c d e f g h i x y", run_words=8)  # a run of 7: not enough
    assert (seven.words, seven.copied) == (9, 0)
    two = prompt_echo(words, "x a b c d e f g h y a b c d e f g h", run_words=8)
    assert two.copied == 16 and two.words == 18  # two copied runs, each of 8
    short = prompt_echo(words, "b  c\n", run_words=8)  # shorter than a run: all of it must occur
    assert (short.words, short.copied, short.verbatim) == (2, 2, True)
    assert prompt_echo(words, "c b", run_words=8).copied == 0  # not in order
    empty = prompt_echo(words, "  ", run_words=8)
    assert empty.words == 0 and math.isnan(empty.share) and not empty.verbatim
    code = prompt_echo(
        PROMPT,
        '    """Return the sum of a and b.\n    >>> add(2, 3)\n    5\n    return a + b',
        run_words=8,
    )
    assert code.words == 15 and code.copied == 11 and not code.verbatim  # all but "return a + b"
    with pytest.raises(ValueError):
        prompt_echo(words, words, run_words=0)


def _prompts(rows):
    return pd.DataFrame(rows, columns=["prompt_id", "domain", "prompt_text", "output_text"])


def test_echo_table_per_domain_with_intervals_and_warnings():
    base = " ".join(f"w{i}" for i in range(40))
    copied = " ".join(f"w{i}" for i in range(10, 30))  # 20 words, all copied
    half = " ".join([*(f"w{i}" for i in range(10)), *(f"n{i}" for i in range(10))])
    new = " ".join(f"n{i}" for i in range(20))
    rows = [
        ("c0", "code", base, copied),
        ("c1", "code", base, copied),
        ("c2", "code", base, half),
        ("h0", "chat", base, new),
        ("h1", "chat", base, half),
        ("h2", "chat", base, new),
        ("h3", "chat", base, ""),
    ]  # h3: no output, left out
    prompts = _prompts(rows)
    ids = tuple(sorted(prompts["prompt_id"]))
    domains = ("chat", "code")
    domain_of = np.array(
        [domains.index(prompts.set_index("prompt_id").loc[p, "domain"]) for p in ids]
    )
    boot = ClusterBootstrap.draw(domain_of, 400, seed=3)
    table = echo_table(ids, domain_of, domains, prompts, boot)
    code, chat, pooled = table.row("code"), table.row("chat"), table.row("All")
    assert (code.prompts, chat.prompts, pooled.prompts) == (3, 3, 6)
    assert code.share.value == pytest.approx((1 + 1 + 0.5) / 3)
    assert chat.share.value == pytest.approx(0.5 / 3)
    assert pooled.share.value == pytest.approx((2.5 + 0.5) / 6)
    assert code.mostly_copied.value == pytest.approx(2 / 3) and HIGH_SHARE == 0.9
    assert code.verbatim.value == pytest.approx(2 / 3) and chat.verbatim.value == 0
    for r in (code, chat, pooled):
        assert r.share.has_interval and r.share.lo <= r.share.value <= r.share.hi
        assert 0 <= r.share.lo and r.share.hi <= 1  # a share's interval stays a share
    assert pooled.share.df == 6 - 2 and code.share.df == 2
    warnings = table.warnings
    assert WARN_SHARE == 0.5 and len(warnings) == 1 and warnings[0].startswith("code: 83%")
    # no texts at all: nothing defined, nothing to warn about
    none = echo_table(ids, domain_of, domains, pd.DataFrame(), boot)
    assert not none.row("All").share.defined and none.warnings == ()


def test_analyze_reports_echo_in_every_output(synthetic_echo_run, tmp_path):
    from specscope.analysis import Settings, analyze
    from specscope.analysis.report import write_outputs

    a = analyze(synthetic_echo_run, Settings(n_boot=50))
    assert a.echo is not None and a.echo.row("code").share.value == pytest.approx(1.0)
    assert a.echo.row("chat").share.value == 0.0
    assert any(w.startswith("prompt echo: code: 100%") for w in a.warnings)
    assert not any("prompt echo: chat" in w for w in a.warnings)
    out = write_outputs(a, tmp_path / "analysis", plots=False)
    assert "Prompt echo" in out.markdown.read_text()
    assert (out.csv_dir / "echo.csv").read_text().startswith("Domain,Prompts,Echo share,")
    assert json.loads(out.json.read_text())["echo"]["run_words"] == 8
    page = out.html.read_text()
    assert 'id="r0-echo"' in page and "prompt echo: code: 100%" in page


@pytest.fixture
def synthetic_echo_run(tmp_path):
    """A synthetic run whose code outputs repeat their prompts and whose chat outputs do not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lab.synthetic import write_synthetic_run

    run = write_synthetic_run(tmp_path / "run", prompts_per_domain=3, steps=(4, 8))
    table = pq.read_table(run / "prompts.parquet")
    df = table.to_pandas()
    text = " ".join(f"token{i}" for i in range(30))
    df["prompt_text"] = "Complete this: " + text
    df["output_text"] = np.where(df["domain"] == "code", text, "something else entirely")
    pq.write_table(
        pa.Table.from_pandas(df, schema=table.schema, preserve_index=False), run / "prompts.parquet"
    )
    return run
