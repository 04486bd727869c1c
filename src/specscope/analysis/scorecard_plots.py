"""The predictor scorecard's reliability diagram (matplotlib, the ``plot`` extra).

One panel per target (node acceptance, prefix acceptance): for each chosen predictor, the mean
observed acceptance against the mean prediction in each of DeepSpec's 20 equal-width bins (all
domains, all draft positions pooled), the diagonal of perfect calibration, and, shaded behind,
the rows per bin of the first predictor, as DeepSpec's ``plot_reliability_diagram`` draws them.
matplotlib is used through its object-oriented API (no pyplot state); this module computes
nothing (the bins come from :class:`specscope.analysis.scorecard.Scorecard`) and writes no file
(:func:`specscope.analysis.plots.write_figure` does).
"""

from __future__ import annotations

from .plots import _figure
from .scorecard import TARGETS, Reliability, Scorecard

_TITLES = {"node": "greedy acceptance of a node", "prefix": "acceptance of the chain's prefix"}


def _curve(ax, rel: Reliability) -> None:
    x = [b.predicted for b in rel.bins]
    y = [b.observed for b in rel.bins]
    ax.plot(x, y, "o-", markersize=3.5, linewidth=1.4, label=f"{rel.predictor} (ECE {rel.ece:.3f})")


def _counts(ax, rel: Reliability) -> None:
    behind = ax.twinx()
    behind.bar(
        [(b.lo + b.hi) / 2 for b in rel.bins],
        [b.rows for b in rel.bins],
        width=[b.hi - b.lo for b in rel.bins],
        color="C0",
        alpha=0.15,
        edgecolor="white",
        linewidth=0.5,
    )
    behind.set_yticks([])
    behind.set_zorder(ax.get_zorder() - 1)
    ax.patch.set_visible(False)


def reliability_plot(card: Scorecard, predictors: tuple[str, ...]):
    """A reliability diagram per target for the named predictors (those the card scored)."""
    targets = [t for t in TARGETS if any(r.target == t for r in card.reliability)]
    fig = _figure(5.2 * max(len(targets), 1), 4.6)
    axes = fig.subplots(1, max(len(targets), 1), squeeze=False)[0]
    for ax, target in zip(axes, targets, strict=False):
        chosen = [
            next((r for r in card.reliability if r.target == target and r.predictor == name), None)
            for name in predictors
        ]
        chosen = [r for r in chosen if r is not None and r.bins]
        if chosen:
            _counts(ax, chosen[0])
        ax.plot([0.0, 1.0], [0.0, 1.0], "--", color="0.6", linewidth=1.0)
        for rel in chosen:
            _curve(ax, rel)
        ax.set_xlim(0.0, 1.0)
        ax.set_ylim(0.0, 1.0)
        ax.set_xlabel("predicted acceptance (bin mean)")
        ax.set_ylabel("observed acceptance (bin mean)")
        ax.set_title(_TITLES.get(target, target), fontsize=10)
        ax.grid(alpha=0.25, linewidth=0.6)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Reliability of acceptance predictors (20 bins, all domains)")
    return fig
