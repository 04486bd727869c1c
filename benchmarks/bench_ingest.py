"""Memory and time of `specscope ingest` and of analysing an ingested run, at sizes engines log.

    python benchmarks/bench_ingest.py make DIR --requests 1000000   # a vLLM log and its prompts
    python benchmarks/bench_ingest.py ingest DIR                    # DIR/run from DIR/log.jsonl
    python benchmarks/bench_ingest.py analyze DIR --boot 1000       # analyze_ingested of DIR/run

Each step prints its wall time and the process's peak resident memory, in full and above what
the imports alone take. Run it with ``PYTHONPATH=OTHER/src`` to measure another checkout on the
same files (see BENCHMARKS.md, "Ingested runs").
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import time
from pathlib import Path

import numpy as np

from specscope.analysis.stepwise import analyze_ingested
from specscope.serving.ingest import ingest, load_ingested

DOMAINS = ("code", "math", "reasoning", "chat")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make(folder: Path, requests: int, seed: int = 0) -> None:
    """vLLM summary lines (chains of 3, 30 steps) joined to prompts by prompt_id."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    accepted = rng.binomial(90, 0.5, size=requests)
    with open(folder / "prompts.jsonl", "w") as prompts, open(folder / "log.jsonl", "w") as log:
        for i in range(requests):
            domain = DOMAINS[i % len(DOMAINS)]
            prompts.write(
                json.dumps(
                    {"id": f"p{i}", "domain": domain, "prompt": f"question {i} about {domain}"}
                )
                + "\n"
            )
            spec = {
                "num_spec_steps": 30,
                "num_accepted_draft_tokens": int(accepted[i]),
                "num_draft_tokens": 90,
            }
            log.write(
                json.dumps(
                    {
                        "prompt_id": f"p{i}",
                        "response": {
                            "id": f"req-{i}",
                            "usage": {"completion_tokens": 31 + int(accepted[i])},
                            "metrics": {"speculative_decoding": spec},
                        },
                    }
                )
                + "\n"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("make", "ingest", "analyze"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--boot", type=int, default=1000)
    args = parser.parse_args()
    base = rss_mb()
    start = time.perf_counter()
    if args.step == "make":
        make(args.folder, args.requests)
    elif args.step == "ingest":
        shutil.rmtree(args.folder / "run", ignore_errors=True)
        manifest = ingest(
            args.folder / "log.jsonl", "vllm", args.folder / "prompts.jsonl", args.folder / "run"
        )
        print(f"{manifest['counts']['requests']} requests")
    else:
        manifest, requests, _ = load_ingested(args.folder / "run")
        analysis = analyze_ingested(manifest, requests, n_boot=args.boot, seed=0)
        print(" ".join(f"{d.domain} {d.tokens_per_step.format(4)}" for d in analysis.domains))
    print(
        f"{args.step}: {time.perf_counter() - start:.1f} s, peak RSS {rss_mb():.0f} MB "
        f"({rss_mb() - base:.0f} MB above the imports)"
    )


if __name__ == "__main__":
    main()
