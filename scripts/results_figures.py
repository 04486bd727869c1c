"""Print the figures of docs/results.md that no `specscope` command prints, from the shipped files.

    python scripts/results_figures.py            # every section
    python scripts/results_figures.py table5     # one: rank0, table5, trajectories, bench

- rank0: the raw signals' AUROC (scikit-learn's, direction chosen) on every node, on the draft's
  first choices (sibling rank 0) and on the top-1 chain's edges with an accepted parent, and
  Spearman's rho(target entropy, alpha) within rank 0, per domain (`analyze --predictors` prints
  the fitted maps' figures on the same rows: tables "rank0" and "edge").
- table5: the paper's Table V (mean alpha by depth, output tokens 1-32 against 33-64) on every
  prompt, on the prompts that reach token 33 (the same prompts in both bins) and on the prompts
  that run to the token cap; intervals resample prompts within domains (percentile, 2,000).
- trajectories: how many of the deep tree's prompts have the paper protocol's greedy output, and
  the paper tree replayed on the deep tree's prompts only.
- bench: each headline speed-up from the shipped bench records, on one basis (the routed policy,
  and each method alone), how many speculative outputs equal plain greedy's, and the llama-server
  draft-model setting's range over the benches on the Intel Xeon.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from specscope.analysis.prepare import read_run
from specscope.analysis.replay import MeasuredTree, replay, top_chain
from specscope.analysis.results import Settings
from specscope.analysis.stats import ClusterBootstrap
from specscope.records import Run

RESULTS = Path(__file__).resolve().parents[1] / "results/demo-pair"
RUNS = ("paper-protocol", "deep-tree")
DOMAINS = ("chat", "code", "math", "reasoning")
N_BOOT = 2000


def _auroc(y: np.ndarray, x: np.ndarray) -> float:
    a = roc_auc_score(y, x)
    return max(a, 1 - a)


def _chain_edges(nodes: pd.DataFrame) -> np.ndarray:
    """Top-1-chain nodes (rank 0 up to the root) whose parent path was accepted."""
    key = ["prompt_id", "step", "node_id"]
    ok = pd.Series(False, index=nodes.index)
    done = nodes.depth == 1
    ok[done] = nodes.sibling_rank[done] == 0
    up = nodes.set_index(key)
    for d in range(2, int(nodes.depth.max()) + 1):
        at = nodes.depth == d
        parent = list(zip(nodes.prompt_id[at], nodes.step[at], nodes.parent_id[at], strict=True))
        p_ok = ok.set_axis(pd.MultiIndex.from_frame(nodes[key])).reindex(parent).to_numpy()
        p_acc = up.greedy_accept.reindex(parent).to_numpy()
        ok[at] = (nodes.sibling_rank[at] == 0).to_numpy() & p_ok & p_acc
    return ok.to_numpy()


def rank0() -> None:
    for run in RUNS:
        n = pd.read_parquet(RESULTS / run / "nodes.parquet")
        y = n.greedy_accept.to_numpy()
        r0 = n.sibling_rank.to_numpy() == 0
        edge = _chain_edges(n)
        print(
            f"{run}: node AUROC draft probability {_auroc(y, n.p_draft):.3f}, "
            f"sibling rank {_auroc(y, -n.sibling_rank):.3f}"
        )
        for label, rows in (("rank 0", r0), ("chain edges, parent accepted", edge)):
            g = n[rows]
            figs = ", ".join(
                f"{s} {_auroc(g.greedy_accept, g[c]):.3f}"
                for s, c in (
                    ("draft probability", "p_draft"),
                    ("draft entropy", "draft_entropy"),
                    ("target entropy", "target_entropy"),
                )
            )
            print(f"  {label} ({rows.sum()} nodes): {figs}")
        rho = {
            d: spearmanr(g.target_entropy, g.alpha).statistic for d, g in n[r0].groupby("domain")
        }
        print(
            "  rho(target entropy, alpha) within rank 0: "
            + " / ".join(f"{d} {v:+.3f}" for d, v in rho.items())
        )


def table5() -> None:
    for run in RUNS:
        n = pd.read_parquet(
            RESULTS / run / "nodes.parquet", columns=["prompt_id", "position_bin", "depth", "alpha"]
        )
        p = pd.read_parquet(
            RESULTS / run / "prompts.parquet", columns=["prompt_id", "domain", "generated_tokens"]
        )
        p = p.sort_values("prompt_id").reset_index(drop=True)
        index = {q: i for i, q in enumerate(p.prompt_id)}
        depth = int(n.depth.max())
        sums, counts = np.zeros((len(p), depth, 2)), np.zeros((len(p), depth, 2))
        at = (n.prompt_id.map(index).to_numpy(), n.depth.to_numpy() - 1, n.position_bin.to_numpy())
        np.add.at(sums, at, n.alpha.to_numpy())
        np.add.at(counts, at, 1)
        boot = ClusterBootstrap.draw(p.domain.to_numpy(), N_BOOT, seed=0)
        late = counts[:, :, 1].sum(axis=1) > 0
        cap = (p.generated_tokens == p.generated_tokens.max()).to_numpy()
        print(
            f"{run}: {len(p)} prompts; {late.sum()} reach token 33 "
            f"({p[~late].groupby('domain').size().to_dict()} do not); {cap.sum()} run to "
            f"{p.generated_tokens.max()} tokens"
        )
        for label, keep in (
            ("all prompts", np.ones(len(p), bool)),
            ("prompts that reach token 33", late),
            ("prompts that run to the cap", cap),
        ):
            for domain in ("All", *DOMAINS):
                rows = keep & ((p.domain == domain).to_numpy() | (domain == "All"))
                w = boot.weights * rows
                mean = np.einsum("bp,pdk->bdk", w, sums) / np.einsum("bp,pdk->bdk", w, counts)
                delta = mean[..., 1] - mean[..., 0]
                lo, hi = np.percentile(delta[1:], [2.5, 97.5], axis=0)
                cells = " | ".join(
                    f"d{d + 1} {mean[0, d, 0]:.3f} -> {mean[0, d, 1]:.3f}: "
                    f"{delta[0, d]:+.3f} [{lo[d]:+.3f}, {hi[d]:+.3f}]"
                    for d in range(depth)
                )
                print(f"  {label}, {domain} ({rows.sum()}): {cells}")


def trajectories() -> None:
    pp = pd.read_parquet(RESULTS / "paper-protocol/prompts.parquet")
    dt = pd.read_parquet(RESULTS / "deep-tree/prompts.parquet")
    both = dt.merge(pp, on="prompt_id", suffixes=("_dt", "_pp"))
    same = np.array(
        [
            list(a) == list(b)
            for a, b in zip(both.output_token_ids_dt, both.output_token_ids_pp, strict=True)
        ]
    )
    first = [
        next((i for i, (x, z) in enumerate(zip(a, b)) if x != z), min(len(a), len(b)))
        for a, b, s in zip(both.output_token_ids_dt, both.output_token_ids_pp, same, strict=True)
        if not s
    ]
    versions = [
        json.loads((RESULTS / r / "manifest.json").read_text())["packages"]["transformers"]
        for r in RUNS
    ]
    print(f"transformers {versions[0]} (paper protocol) and {versions[1]} (deep tree)")
    print(
        f"greedy outputs equal on {same.sum()} of {len(both)} shared prompts: "
        + " / ".join(f"{d} {same[(both.domain_dt == d).to_numpy()].sum()}" for d in DOMAINS)
        + f"; the others first differ at output token {min(first)} to {max(first)} "
        f"(median {int(np.median(first))})"
    )
    run = read_run(RESULTS / "paper-protocol")
    keep = set(dt.prompt_id)
    sub = Run(
        run.path,
        run.manifest,
        *(
            t[t.prompt_id.isin(keep)].reset_index(drop=True)
            for t in (run.nodes, run.steps, run.prompts)
        ),
    )
    for candidate in (MeasuredTree(), top_chain(3)):
        for name, source in (
            ("paper tree, all 200 prompts", run),
            ("paper tree, the deep tree's 120", sub),
        ):
            r = replay(source, candidate, Settings(n_boot=N_BOOT))
            print(
                f"{name}, {r.candidate}: decoded tokens per step "
                + " / ".join(f"{x.domain} {x.tokens_per_step.value:.2f}" for x in r.rows)
            )
    r = replay(RESULTS / "deep-tree", top_chain(3), Settings(n_boot=N_BOOT))
    print(
        "deep tree, its chain cut at 3: "
        + " / ".join(f"{x.domain} {x.tokens_per_step.value:.2f}" for x in r.rows)
    )


def _decode_speed(runs: list[dict]):
    """Decode tokens per second of a method in a domain ("all": every domain): tokens after the
    first step over each prompt's median decoding time over its repeats, as the bench reads it."""

    def seconds(r: dict) -> float:
        times = np.subtract(r["repeat_times_s"], r["repeat_first_token_s"])
        return float(np.median(times)) if len(times) else r["time_s"] - r["first_token_s"]

    def speed(method: str, domain: str) -> float:
        rows = [r for r in runs if r["method"] == method and domain in (r["domain"], "all")]
        tokens = sum(len(r["tokens"]) - r["first_tokens"] for r in rows)
        return tokens / sum(seconds(r) for r in rows if len(r["tokens"]) > r["first_tokens"])

    return speed


def bench() -> None:
    for path in ("drafters/decisions/bench-heldout.json", "drafters-bf16-full/bench-heldout.json"):
        d = json.loads((RESULTS / path).read_text())
        rows = {(r["method"], r["domain"]): r for r in d["rows"]}
        plain = {r["prompt_id"]: r["tokens"] for r in d["runs"] if r["method"] == "plain"}
        print(
            f"{path} ({'int8' if d['int8'] else d['dtype']}): decode speed-up over plain "
            "(Σ tokens after the first step / Σ each prompt's median seconds; interval: the bench's)"
        )

        speed = _decode_speed(d["runs"])
        for method in ("routed", "chain", "ngram", "assisted"):
            runs = [r for r in d["runs"] if r["method"] == method]
            equal = sum(r["tokens"] == plain[r["prompt_id"]] for r in runs)
            cells = " / ".join(
                f"{dom} {speed(method, dom) / speed('plain', dom):.3f} "
                f"[{rows[method, dom]['speedup_lo']:.2f}, {rows[method, dom]['speedup_hi']:.2f}]"
                for dom in ("code", "math", "reasoning", "chat", "all")
            )
            print(f"  {method}: {cells}; outputs equal to plain greedy's: {equal} of {len(runs)}")
        routed = [r for r in d["runs"] if r["method"] == "routed" and r["routed_to"] != r["domain"]]
        sent = {}
        for r in routed:
            sent[r["domain"]] = sent.get(r["domain"], 0) + 1
        print(f"  prompts routed to another domain's entry: {sent}")
    for bench_dir in ("llamacpp", "llamacpp/route-test", "llamacpp/poll"):
        d = json.loads((RESULTS / bench_dir / "bench.json").read_text())
        rows = {r["domain"]: r["speedup"] for r in d["rows"] if r["method"] == "draft-simple:k=3"}
        print(
            f"{bench_dir}: draft-simple:k=3 " + " / ".join(f"{k} {v:.3f}" for k, v in rows.items())
        )


SECTIONS = {"rank0": rank0, "table5": table5, "trajectories": trajectories, "bench": bench}

if __name__ == "__main__":
    for name in sys.argv[1:] or SECTIONS:
        print(f"== {name}")
        SECTIONS[name]()
