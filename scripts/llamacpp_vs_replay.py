"""Tokens per step llama-server measured (results/demo-pair/llamacpp/requests.parquet) against the
paper-protocol run's recorded trees replayed as greedy decoding on the same prompts, for the
chains of K = 1 and 2 that ran the measured Q4_K_M pair (K = 3 and 4 ran a Q4_0 target: another
model). Both sides leave out the prefill (its token and its pass), as llama-server's counts do.

    python scripts/llamacpp_vs_replay.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specscope.analysis.replay import index_records, replay_counts, top_chain

RESULTS = Path(__file__).resolve().parents[1] / "results" / "demo-pair"


def main() -> None:
    server = pd.read_parquet(RESULTS / "llamacpp" / "requests.parquet")
    rec = index_records(RESULTS / "paper-protocol")
    rows = []
    for k in (1, 2):
        counts = replay_counts(rec, top_chain(k), prefill_drafts=False)
        replayed = pd.DataFrame(
            {
                "prompt_id": list(rec.prompt_ids),
                "positions": counts.positions,
                "passes": counts.steps,
            }
        )
        both = server[server.method == f"k{k}"].merge(replayed, on="prompt_id", validate="1:1")
        for domain, g in both.groupby("domain"):
            measured = (g.accepted.sum() + g.steps.sum()) / g.steps.sum()
            replay = (g.positions.sum() - len(g)) / (g.passes.sum() - len(g))
            rows.append((k, domain, len(g), measured, replay, replay / measured - 1))
    table = pd.DataFrame(
        rows, columns=["K", "domain", "prompts", "llama-server", "replay", "replay / server - 1"]
    )
    print(table.to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
