"""The same small sweep with the local executor and with Ray on 2 workers: wall time and ratio.

    python benchmarks/bench_sweep.py [--prompts 12] [--max-new-tokens 64] [--hidden 512]

The pair is a randomly initialised Llama draft/target built here (byte-level tokenizer, no
downloads), large enough that model compute dominates Ray's start-up. The sweep is 2 trees
(paper, chain of 4) x 2 domains (JSONL prompt files), cut into shards of --prompts-per-shard
prompts. Torch runs 1 thread in the local process and 1 thread in each Ray worker (Ray gets
--workers CPUs, a shard reserves 1), so Ray's gain is the parallelism of its workers. The Ray time
includes starting the local Ray instance; the time of the sweep alone is printed beside it. The
records of both are checked to be identical (timing columns excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

from specscope.models.tiny import byte_tokenizer, tiny_model
from specscope.records import TIMING_COLUMNS, load_run
from specscope.sweep import Execution, parse_sweep, run_sweep, sweep_run_dirs


def save_model(path: Path, tok, seed: int, layers: int, hidden: int) -> str:
    """A tiny random Llama (8 heads, 4 KV heads) and the tokenizer, saved to ``path``."""
    model = tiny_model(
        "llama", len(tok), seed, layers, hidden, heads=8, kv_heads=4, max_positions=2048
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def records(run_dir: Path) -> list[pd.DataFrame]:
    run = load_run(run_dir)
    return [
        t.drop(columns=[c for c in TIMING_COLUMNS if c in t]).reset_index(drop=True)
        for t in (run.nodes, run.steps, run.prompts)
    ]


def shard_seconds(sweep_dir: Path) -> tuple[float, float]:
    """Mean wall and CPU time of a shard, from the shard status files."""
    shards = [json.loads(f.read_text()) for f in (sweep_dir / "shards").glob("*.json")]
    return (
        sum(s["seconds"] for s in shards) / len(shards),
        sum(s["cpu_seconds"] for s in shards) / len(shards),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12, help="prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts-per-shard", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--draft-layers", type=int, default=2)
    parser.add_argument("--target-layers", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2, help="Ray CPUs = concurrent shards")
    parser.add_argument(
        "--local-threads",
        type=int,
        default=1,
        help="torch threads of the local run (1: the same per-shard budget)",
    )
    args = parser.parse_args()

    import ray

    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    tok = byte_tokenizer()
    draft = save_model(tmp / "draft", tok, 1, args.draft_layers, args.hidden)
    target = save_model(tmp / "target", tok, 2, args.target_layers, args.hidden)
    domains = []
    for domain in ("code", "chat"):
        path = tmp / f"{domain}.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    {
                        "id": f"{domain}{i}",
                        "domain": domain,
                        "prompt": f"Prompt {i} of the {domain} domain: go on.",
                    }
                )
                + "\n"
                for i in range(args.prompts)
            )
        )
        domains.append({"name": domain, "file": str(path)})
    spec = parse_sweep(
        {
            "name": "bench",
            "defaults": {
                "max_new_tokens": args.max_new_tokens,
                "pair": {"draft": draft, "target": target, "dtype": "float32"},
            },
            "trees": [{"policy": "paper"}, {"name": "chain4", "policy": "chain", "depth": 4}],
            "domains": domains,
        }
    )
    shards = len(spec.points()) * -(-args.prompts // args.prompts_per_shard)
    print(
        f"sweep: {len(spec.points())} grid points x {args.prompts} prompts x "
        f"{args.max_new_tokens} tokens = {shards} shards of {args.prompts_per_shard} prompts; "
        f"Llama hidden {args.hidden}, draft {args.draft_layers} / target {args.target_layers} "
        f"layers, float32; torch threads: {args.local_threads} local, 1 per Ray worker"
    )

    t0 = time.perf_counter()
    local = run_sweep(
        spec,
        tmp / "local",
        executor="local",
        progress=False,
        execution=Execution(prompts_per_shard=args.prompts_per_shard, threads=args.local_threads),
    )
    t_local = time.perf_counter() - t0

    t0 = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    t_init = time.perf_counter() - t0
    remote = run_sweep(
        spec,
        tmp / "ray",
        executor="ray",
        progress=False,
        execution=Execution(prompts_per_shard=args.prompts_per_shard, threads=1),
    )
    t_ray = time.perf_counter() - t0
    ray.shutdown()

    same = args.local_threads != 1 or all(
        all(x.equals(y) for x, y in zip(records(a), records(b)))
        for a, b in zip(sweep_run_dirs(tmp / "local"), sweep_run_dirs(tmp / "ray"))
    )
    print(f"{'executor':<22}{'wall s':>9}{'nodes':>9}{'nodes/s':>10}")
    print(f"{'local':<22}{t_local:>9.1f}{local.nodes:>9}{local.nodes / t_local:>10.1f}")
    print(
        f"{f'ray, {args.workers} workers':<22}{t_ray:>9.1f}{remote.nodes:>9}"
        f"{remote.nodes / t_ray:>10.1f}   (ray.init {t_init:.1f} s, sweep {t_ray - t_init:.1f} s)"
    )
    print(
        f"ratio local / ray: {t_local / t_ray:.2f}x (sweep alone: "
        f"{t_local / (t_ray - t_init):.2f}x); records identical: "
        f"{'yes' if same else 'NO'}{' (not compared: other thread count)' if args.local_threads != 1 else ''}"
    )
    (local_s, local_cpu), (ray_s, ray_cpu) = (
        shard_seconds(tmp / "local"),
        shard_seconds(tmp / "ray"),
    )
    print(
        f"mean shard: {local_s:.1f} s wall / {local_cpu:.1f} s CPU local, {ray_s:.1f} s wall / "
        f"{ray_cpu:.1f} s CPU on a Ray worker (wall well above CPU means other processes took the cores); "
        f"load average (1 min) now {os.getloadavg()[0]:.1f}"
    )
    print(f"(files left in {tmp})")


if __name__ == "__main__":
    main()
