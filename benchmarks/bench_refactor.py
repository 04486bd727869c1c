"""The speculation core before and after a restructuring: the same work timed on either checkout.

    python benchmarks/bench_refactor.py compare --before OLD/src --after NEW/src [--repeats 3]
    PYTHONPATH=SRC python benchmarks/bench_refactor.py run1|run8|sweep|decode --models DIR

``compare`` builds seeded random-weight Llama pairs once (hidden 256, 4 layers, a draft made
from the target by 5% weight noise, the byte tokenizer of tests/conftest.py), then times every
work on both checkouts in alternation, each in a fresh process (``PYTHONPATH`` picks the
checkout), and prints each work's seconds (median and range over the repeats) and the ratio
before/after. The works: ``run1``/``run8``, ``specscope run`` of 8 prompts x 16 tokens (paper tree,
float32) at batch size 1 or 8; ``sweep``, a local sweep of those prompts over 2 trees at the
sweep's default batch size (the checkout's own: 1 before sweeps were batched); ``decode``, greedy
speculative decoding of 3 prompts x 24 tokens with a paper tree, a depth-4 chain and a dynamic
tree. Model loading and imports are outside the timed part, except in the sweep, which loads its
pair itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

WORKS = ("run1", "run8", "sweep", "decode")
PROMPTS = [
    "Hi.",
    "Explain recursion " * 6,
    "2+2?",
    "Write a long story about " * 3 + "a cat.",
    "Why?",
    "List three colours, please.",
    "ok",
    "Translate 'bonjour' to English.",
]


def build_models(root: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import make_model, make_tokenizer

    tok = make_tokenizer()
    for role in ("draft", "target"):
        model = make_model("llama", len(tok), seed=2, layers=4, hidden=256)
        if role == "draft":
            torch.manual_seed(7)
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1 + 0.05 * torch.randn_like(p))
        model.save_pretrained(root / role)
        tok.save_pretrained(root / role)
    (root / "prompts.jsonl").write_text(
        "".join(
            json.dumps({"id": f"q{i}", "domain": "code", "prompt": t}) + "\n"
            for i, t in enumerate(PROMPTS)
        )
    )


def work(name: str, models: Path) -> None:
    """Time one work on the checkout that PYTHONPATH gives; print its seconds."""
    from specscope.models import PairConfig, load_pair
    from specscope.run.config import PromptSpec, RunConfig
    from specscope.trees import TreeConfig

    pair_config = PairConfig(
        draft=str(models / "draft"), target=str(models / "target"), dtype="float32"
    )
    config = RunConfig(
        pair=pair_config,
        tree=TreeConfig(policy="paper"),
        prompts=PromptSpec(file=str(models / "prompts.jsonl")),
        max_new_tokens=16,
    )
    pair = load_pair(pair_config)
    # every work's modules imported before the clock starts, like the model load: an import that
    # one checkout does earlier than the other (through a circle) is not the work's time
    from specscope.decode import DecodeConfig, make_decoder
    from specscope.run.study import run_study
    from specscope.sweep import Execution, parse_sweep, run_sweep
    from specscope.trees import DynamicTree

    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        if name in ("run1", "run8"):
            run_study(
                config, Path(out) / "run", progress=False, pair=pair, batch_size=int(name[-1])
            )
        elif name == "sweep":
            spec = parse_sweep(
                {
                    "name": "bench",
                    "defaults": {
                        "max_new_tokens": 16,
                        "pair": {
                            "draft": pair_config.draft,
                            "target": pair_config.target,
                            "dtype": "float32",
                        },
                        "prompts": {"file": str(models / "prompts.jsonl")},
                    },
                    "trees": [
                        {"name": "paper", "policy": "paper"},
                        {"name": "chain", "policy": "chain", "depth": 4},
                    ],
                }
            )
            run_sweep(
                spec, Path(out) / "sweep", execution=Execution(prompts_per_shard=8), progress=False
            )
        else:
            decoder = make_decoder(pair)
            for spec in (
                TreeConfig(policy="paper").shape(),
                TreeConfig(policy="chain", depth=4).shape(),
                DynamicTree(12, 4, 3),
            ):
                for text in PROMPTS[:3]:
                    ids = pair.tokenizer(text)["input_ids"]
                    decoder.generate(ids, spec, DecodeConfig(max_new_tokens=24))
        print(f"{time.perf_counter() - t0:.3f}")


def compare(before: str, after: str, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp)
        build_models(models)
        seconds: dict[tuple[str, str], list[float]] = {}
        for r in range(repeats):
            for name in WORKS:
                sides = (("before", before), ("after", after))
                for side, src in sides if r % 2 == 0 else sides[::-1]:  # alternate who goes first
                    env = {**os.environ, "PYTHONPATH": src}
                    out = subprocess.run(
                        [sys.executable, __file__, name, "--models", str(models)],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    seconds.setdefault((name, side), []).append(float(out.stdout.split()[-1]))
                    print(
                        f"repeat {r} {name:<6} {side:<6} {seconds[name, side][-1]:7.2f} s",
                        flush=True,
                    )
    print(f"\n{'work':<8}{'before s (range)':>22}{'after s (range)':>22}{'before/after':>22}")
    for name in WORKS:
        b, a = seconds[name, "before"], seconds[name, "after"]
        ratios = [x / y for x, y in zip(b, a)]
        print(
            f"{name:<8}{statistics.median(b):>9.2f} ({min(b):.2f}-{max(b):.2f})"
            f"{statistics.median(a):>9.2f} ({min(a):.2f}-{max(a):.2f})"
            f"{statistics.median(ratios):>10.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", choices=("compare",) + WORKS)
    parser.add_argument("--models", type=Path, help="the pair and prompts compare built")
    parser.add_argument("--before", help="src directory of the checkout before")
    parser.add_argument("--after", help="src directory of the checkout after")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.work == "compare":
        compare(args.before, args.after, args.repeats)
    else:
        work(args.work, args.models)


if __name__ == "__main__":
    main()
