"""Grids (:class:`.render.Grid`) of decoded tokens per step (:mod:`.replay`), of the level-wise
effects (:mod:`.levels`) and of the findings across tree shapes (:mod:`.shapes`), for the report
and ``analyze`` output. Builds tables only;
computes nothing.
"""

from __future__ import annotations

from .levels import POSITION_MEAN, LevelEffects, LevelFinding
from .render import Column, Grid
from .replay import DecodedTable
from .shapes import QUANTITIES, ShapeComparison


def level_shares_grid(levels: LevelEffects) -> Grid:
    """The share of variance domain explains at each level, with the components."""
    names = tuple(dict.fromkeys(c.name for s in levels.shares for c in s.components))
    return Grid(
        "level_shares",
        "What domain explains at each level: node, step, prompt",
        (
            Column("Level"),
            Column("Measure"),
            Column("Units"),
            Column("domain η² (raw)", 3),
            Column("domain, noise-corrected", 3),
        )
        + tuple(Column(name, 3) for name in names),
        tuple(
            (s.level, s.measure, s.units, s.domain_raw, s.domain)
            + tuple(s.component(name) for name in names)
            for s in levels.shares
        ),
        "Share of the variance of the measure explained by domain: raw η² (one-way), and "
        "corrected for the sampling noise of the domain means. The remaining columns split the "
        "variance into parts that sum to 1: at the node level the sequential least-squares "
        "shares of the node decomposition (not noise-corrected), at the step level domain, "
        "prompt within domain and step within prompt, at the prompt level domain and prompt "
        f"within domain, each noise-corrected. '{POSITION_MEAN}': tau averaged over every "
        "recorded output position, which overstates decoded tokens per step. Intervals: "
        "prompts resampled within domains.",
    )


def domain_effect_grid(levels: LevelEffects) -> Grid:
    """Each domain's tokens per step against the other domains', per level."""
    return Grid(
        "domain_effect",
        "The domain effect in tokens per step",
        (
            Column("Level"),
            Column("Measure"),
            Column("Domain"),
            Column("tokens per step"),
            Column("other domains"),
            Column("relative", signed=True),
        ),
        tuple((e.level, e.measure, e.domain, e.mean, e.others, e.relative) for e in levels.effects),
        "other domains: the mean of the other domains' means, each domain weighted alike. "
        "relative: the domain's mean divided by theirs, minus 1 (−0.18: 18% fewer tokens per "
        "step). Step level: mean over steps; prompt level: mean over prompts of each "
        "prompt's mean.",
    )


def level_findings_grid(findings: tuple[LevelFinding, ...]) -> Grid:
    """Findings with the level each is tested at."""
    return Grid(
        "level_findings",
        "Findings and the level they are tested at",
        (
            Column("Claim"),
            Column("Level"),
            Column("This run [95% CI]", 4, signed=True),
            Column("Verdict"),
            Column("Detail"),
        ),
        tuple(
            (
                f.finding.claim,
                f.level,
                f.finding.estimate,
                f.finding.verdict.value,
                f.finding.detail,
            )
            for f in findings
        ),
        "A verdict holds at the level named, and at no other: a node-level share says little "
        "about tokens per step.",
    )


def shape_figures_grid(c: ShapeComparison) -> Grid:
    """Each domain's figures in every shape."""
    return Grid(
        "shape_figures",
        "Per-domain figures in every tree shape",
        (Column("Shape"), Column("Domain"), Column("Prompts"))
        + tuple(Column(q) for q in QUANTITIES),
        tuple(
            (r.shape, d, n) + tuple(r.figure(d, q) for q in QUANTITIES)
            for r in c.shapes
            for d, n in r.domain_prompts
        ),
        "top-1 chain: the nodes whose every ancestor has sibling rank 0, and the tau that chain "
        "alone gives, from the same records. E[L]: the paper's formula (alpha). decoded tokens "
        "per step: the shape's trees replayed as greedy decoding (output tokens over decoding "
        "steps). tau: tokens per recorded position "
        f"({POSITION_MEAN}). Intervals: prompts resampled within domains.",
    )


def shape_verdicts_grid(c: ShapeComparison) -> Grid:
    """Each domain finding's verdict in every shape."""
    keys = tuple(dict.fromkeys(v.key for r in c.shapes for v in r.verdicts))
    rows = []
    for key in keys:
        found = [r.verdict(key) for r in c.shapes]
        first = next(v for v in found if v is not None)
        rows.append(
            (first.claim, first.level)
            + tuple(v.verdict.value if v is not None else None for v in found)
        )
    return Grid(
        "shape_verdicts",
        "Domain findings in every tree shape",
        (Column("Claim"), Column("Level")) + tuple(Column(r.shape) for r in c.shapes),
        tuple(rows),
        "The same claim and rule in every shape. '<domain> has the lowest <figure>': the domain "
        "lowest in the first shape, tested in each (holds: significantly below every other "
        "domain; does not hold: some other domain significantly below it, Bonferroni).",
    )


def shape_changes_grid(c: ShapeComparison) -> Grid:
    """The orderings and verdicts that differ between shapes, with the pairs that swap."""
    rows = []
    for ch in c.changes:
        flips = "; ".join(
            f"{f.first} − {f.second}: "
            + " / ".join(e.format(3, signed=True) if e is not None else "—" for e in f.differences)
            + (" (resolved)" if f.resolved else "")
            for f in ch.flips
        )
        rows.append((ch.kind, ch.subject) + ch.states + (flips or None,))
    return Grid(
        "shape_changes",
        "Where a verdict or the ordering of domains changes with the tree shape",
        (Column("Change"), Column("Subject"))
        + tuple(Column(r.shape) for r in c.shapes)
        + (Column("Pairs that swap (difference per shape)"),),
        tuple(rows),
        "ordering: the domains lowest first on the figure, per shape; the pairs that swap, "
        "with the difference in each shape in the order of the columns; 'resolved' where the "
        "pair is significantly ordered one way in some shape and the other way in another "
        "(one-sided, half of 1 − confidence). A swap that is not resolved may be noise.",
    )


def decoded_grid(table: DecodedTable) -> Grid:
    first = "tree drafted in the prefill pass" if table.prefill_drafts else "plain prefill pass"
    return Grid(
        "decoded_tokens_per_step",
        "Decoded tokens per step (recorded trees replayed as greedy decoding)",
        (
            Column("Domain"),
            Column("Prompts"),
            Column("Tokens"),
            Column("Decoding steps"),
            Column("decoded tokens/step"),
            Column("position mean"),
            Column(f"top-1 chain({table.chain_depth}), decoded"),
        ),
        tuple(
            (r.domain, r.prompts, r.positions, r.steps, r.decoded, r.position_mean, r.chain)
            for r in table.rows
        ),
        "decoded: greedy decoding replayed on the recorded trees (at output position i it emits "
        "the accepted path and the bonus token, min(accepted_len_i, L − i − 1) + 1 tokens, and "
        f"moves past them; {first}): output tokens over decoding steps. position mean: "
        "accepted_len + 1 averaged over every position, which counts a run of acceptance at each "
        "of its positions and ignores the output's end, so it overstates decoding. top-1 chain: "
        "the sibling-rank-0 path of the same trees, replayed the same way. Intervals: prompts "
        "resampled within domains.",
    )
