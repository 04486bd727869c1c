"""Prompt echo: how much of each output is copied verbatim from its prompt.

A domain whose outputs mostly repeat the prompt (a code prompt's docstring, an extraction task's
passage) gets high acceptance for a reason that has nothing to do with the draft predicting new
text: any model copies well. This module measures that copying per prompt and per domain, with
the analysis's prompt-clustered intervals, and words a warning when a domain's share is high.

The measure works on the recorded texts (``prompt_text`` and ``output_text`` of prompts.parquet),
split into whitespace-separated words, so it needs no tokenizer and gives the same figure for any
model pair (prompt token ids are not recorded). An output word counts as *copied* when it lies
inside a run of at least :data:`RUN_WORDS` consecutive output words that also occurs, word for
word, somewhere in the prompt. The prompt's share is copied words / output words; a domain's is
the mean over its prompts (each prompt weighs the same), its interval kept within [0, 1]. It does
not judge whether copying is the right answer (a completion may rightly restate a signature), nor
look below the word level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .prepare import ALL
from .stats import ClusterBootstrap, Estimate, bounded, ratio

RUN_WORDS = 8  # shortest run of consecutive output words, found verbatim in the prompt, that counts
HIGH_SHARE = 0.9  # a prompt whose share reaches this is "mostly copied"
WARN_SHARE = 0.5  # a domain whose mean share reaches this gets a warning


@dataclass(frozen=True)
class PromptEcho:
    """One prompt's echo: output words, how many are copied, and whether the whole output is."""

    words: int
    copied: int
    verbatim: bool  # the whole output (whitespace folded) occurs in the prompt

    @property
    def share(self) -> float:
        return self.copied / self.words if self.words else math.nan


def prompt_echo(prompt_text: str, output_text: str, run_words: int = RUN_WORDS) -> PromptEcho:
    """Copied output words of one prompt (see the module docstring for the definition).

    An output shorter than ``run_words`` words counts as copied only when all of it occurs in
    the prompt as consecutive words.
    """
    if run_words < 1:
        raise ValueError(f"run_words must be >= 1, got {run_words}")
    out, prompt = output_text.split(), prompt_text.split()
    if not out:
        return PromptEcho(0, 0, False)
    n = min(run_words, len(out))
    grams = {tuple(prompt[i : i + n]) for i in range(len(prompt) - n + 1)}
    copied = np.zeros(len(out), bool)
    for i in range(len(out) - n + 1):
        if tuple(out[i : i + n]) in grams:
            copied[i : i + n] = True
    verbatim = " ".join(out) in " ".join(prompt)
    return PromptEcho(len(out), int(copied.sum()), verbatim)


@dataclass(frozen=True)
class EchoRow:
    """One domain's echo (or All's): means over its prompts with output text."""

    domain: str
    prompts: int  # prompts with a non-empty output
    share: Estimate  # mean share of output words copied from the prompt
    mostly_copied: Estimate  # share of prompts with at least HIGH_SHARE of their words copied
    verbatim: Estimate  # share of prompts whose whole output occurs in the prompt


@dataclass(frozen=True)
class EchoTable:
    """Prompt echo per domain, the parameters behind it, and the domains it warns about."""

    run_words: int
    high_share: float
    warn_share: float
    rows: tuple[EchoRow, ...]

    def row(self, domain: str) -> EchoRow | None:
        return next((r for r in self.rows if r.domain == domain), None)

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per domain whose mean echo share reaches ``warn_share``."""
        return tuple(
            f"{r.domain}: {r.share.value:.0%} of output words are copied from the prompt "
            f"(runs of >= {self.run_words} words found verbatim there; warning at "
            f"{self.warn_share:.0%}); {r.verbatim.value:.0%} of its outputs occur whole in the "
            f"prompt, so its acceptance largely measures copying, not prediction "
            f"(docs/metrics.md, prompt echo)"
            for r in self.rows
            if r.domain != ALL and r.share.defined and r.share.value >= self.warn_share
        )


def echo_table(
    prompt_ids: tuple[str, ...],
    prompt_domain: np.ndarray,
    domains: tuple[str, ...],
    prompts: pd.DataFrame,
    boot: ClusterBootstrap,
    run_words: int = RUN_WORDS,
) -> EchoTable:
    """Echo per domain and over all domains, with intervals from ``boot`` (whose columns are
    ``prompt_ids``, stratified by ``prompt_domain``, indices into ``domains``). Prompts without
    text in ``prompts`` (or with an empty output) are left out."""
    texts = {}
    if len(prompts) and {"prompt_id", "prompt_text", "output_text"} <= set(prompts.columns):
        for pid, p, o in zip(prompts["prompt_id"], prompts["prompt_text"], prompts["output_text"]):
            texts[str(pid)] = (str(p or ""), str(o or ""))
    P = len(prompt_ids)
    values = np.zeros((P, 4))  # has output, share, mostly copied, verbatim
    for i, pid in enumerate(prompt_ids):
        if pid not in texts:
            continue
        e = prompt_echo(*texts[pid], run_words=run_words)
        if e.words:
            values[i] = (1.0, e.share, float(e.share >= HIGH_SHARE), float(e.verbatim))
    rows = []
    for g, label in enumerate(domains + (ALL,)):
        member = np.ones(P, bool) if label == ALL else np.asarray(prompt_domain) == g
        totals = boot.total(values * member[:, None])  # (B + 1, 4)
        counted = member & (values[:, 0] > 0)
        n = int(counted.sum())
        strata = len(np.unique(np.asarray(prompt_domain)[counted])) if n else 1
        ests = [
            bounded(boot.estimate(ratio(totals[:, k], totals[:, 0]), n=n, prompts=n, strata=strata))
            for k in (1, 2, 3)
        ]
        rows.append(EchoRow(label, n, *ests))
    return EchoTable(run_words, HIGH_SHARE, WARN_SHARE, tuple(rows))


__all__ = [
    "HIGH_SHARE",
    "RUN_WORDS",
    "WARN_SHARE",
    "EchoRow",
    "EchoTable",
    "PromptEcho",
    "echo_table",
    "prompt_echo",
]
