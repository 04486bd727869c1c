"""Loading the demo pair in int8: quantised from float32 (an empty int8 cache) vs read from the
int8 cache, side by side, each load a fresh process.

    python benchmarks/bench_int8_load.py [--repeats 3] [--before OLD_CHECKOUT/src]

Each repetition runs, with ``--before``, a load by an older checkout (which quantises at every
load), then a cold load (the int8 cache emptied first: load float32, quantise, keep the entry),
then a warm one (read the entry), in a temporary SPECSCOPE_CACHE that links the real cache's demo
checkpoints. Prints each load's seconds and peak resident memory, the medians and their ratios to
the warm load, and checks that every load gives the same logits on one prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specscope.cache import cache_dir

CHILD = """
import json, resource, sys, time
import torch
from specscope.models import PairConfig, load_pair
t0 = time.perf_counter()
pair = load_pair(PairConfig(dtype="float32", quantize="int8"))
seconds = time.perf_counter() - t0
ids = pair.tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
with torch.inference_mode():
    logits = [m.model(ids).logits[0, -1] for m in (pair.draft, pair.target)]
torch.save(logits, sys.argv[1])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"seconds": seconds, "peak_gib": peak}))
"""


def load_once(cache: Path, logits: Path, src: str | None = None) -> dict:
    env = {**os.environ, "SPECSCOPE_CACHE": str(cache)}
    if src:
        env["PYTHONPATH"] = src
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(logits)], env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="src/ of an older checkout, loaded first each repeat")
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        for name in ("demo", "gguf"):
            if (cache_dir() / name).exists():
                (cache / name).symlink_to(cache_dir() / name)
        kinds = {"before": args.before, "cold": None, "warm": None}
        if not args.before:
            del kinds["before"]
        rows = {kind: [] for kind in kinds}
        for repeat in range(args.repeats):
            shutil.rmtree(cache / "int8", ignore_errors=True)
            for kind, src in kinds.items():
                row = load_once(cache, cache / f"{kind}.pt", src)
                rows[kind].append(row)
                print(
                    f"repeat {repeat + 1} {kind}: {row['seconds']:.1f} s, {row['peak_gib']:.2f} GiB"
                )
            logits = [torch.load(cache / f"{kind}.pt") for kind in kinds]
            assert all(
                torch.equal(a, b) for other in logits[1:] for a, b in zip(logits[0], other)
            ), "logits differ"
    warm = {m: statistics.median(r[m] for r in rows["warm"]) for m in ("seconds", "peak_gib")}
    for kind, runs in rows.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        peak = statistics.median(r["peak_gib"] for r in runs)
        print(
            f"median {kind}: {seconds:.1f} s ({seconds / warm['seconds']:.2f}x warm), "
            f"peak {peak:.2f} GiB ({peak / warm['peak_gib']:.2f}x warm)"
        )
    print("logits equal in every repeat")


if __name__ == "__main__":
    main()
