"""Records and decoded tokens of one checkout, on seeded tiny pairs, to compare two checkouts.

    PYTHONPATH=OLD/src python scripts/records_before_after.py write OUT/before
    PYTHONPATH=NEW/src python scripts/records_before_after.py write OUT/after
    python scripts/records_before_after.py compare OUT/before OUT/after

``write`` measures every config below (two architectures; float32, bfloat16 and int8; batch sizes
1 and 4; the cached and the naive engine; two trees) into run directories and decodes prompts with
many trees and decode settings (greedy, early stops, sampling with seeds), writing the tokens and
steps as JSON. The tiny pairs are built from fixed seeds (tests/conftest.py) and saved under
OUT/../models once, so both checkouts read the same weights. ``compare`` prints, per config, whether
the records are the same bits, else the largest difference of each float column and the rows whose
other columns differ; and how many decodes gave other tokens or steps. It compares any two folders
of run directories (``runs/NAME``), e.g. scripts/demo_pair_before_after.sh's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import make_model, make_tokenizer  # noqa: E402

ARCHS = ("llama", "qwen2")
DTYPES = {
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"dtype": "float32", "quantize": "int8"},
}
TREES = {"paper": {"policy": "paper"}, "chain4": {"policy": "chain", "depth": 4}}
PROMPTS = [
    "Hi.",
    "Explain recursion " * 6,
    "2+2?",
    "Write a long story about " * 3 + "a cat.",
    "Why?",
    "List three colours, please.",
]
DECODE_PROMPTS = ["def add(a, b):\n    return", "The capital of France is", "Once upon a time"]


def models(root: Path) -> dict:
    """Saved tiny (draft, target) dirs per architecture: a draft near its target."""
    tok = make_tokenizer()
    dirs = {}
    for arch in ARCHS:
        for role in ("draft", "target"):
            path = root / f"{arch}-{role}"
            dirs[arch, role] = path
            if path.is_dir():
                continue
            model = make_model(arch, len(tok), seed=2, layers=2)
            if role == "draft":
                torch.manual_seed(7)
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1 + 0.05 * torch.randn_like(p))
            model.save_pretrained(path)
            tok.save_pretrained(path)
    return dirs


def configs():
    for arch in ARCHS:
        for dtype in DTYPES:
            for tree in TREES:
                for engine, batches in (("cached", (1, 4)), ("naive", (1,))):
                    if engine == "naive" and tree != "paper":
                        continue
                    for batch in batches:
                        name = f"{arch}.{dtype}.{tree}.{engine}.b{batch}"
                        yield name, arch, dtype, tree, engine, batch


def write(out: Path) -> None:
    from specscope.decode import DecodeConfig, SpeculativeDecoder
    from specscope.models import PairConfig, load_pair
    from specscope.run.config import PromptSpec, RunConfig
    from specscope.run.study import run_study
    from specscope.trees import DynamicTree, TreeConfig, TreeShape

    torch.set_num_threads(1)
    dirs = models(out.parent / "models")
    prompts = out.parent / "prompts.jsonl"  # one path for both checkouts: it is in the records
    out.mkdir(parents=True, exist_ok=True)
    prompts.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "domain": ["code", "chat"][i % 2], "prompt": t}) + "\n"
            for i, t in enumerate(PROMPTS)
        )
    )
    for name, arch, dtype, tree, engine, batch in configs():
        pair = PairConfig(
            draft=str(dirs[arch, "draft"]), target=str(dirs[arch, "target"]), **DTYPES[dtype]
        )
        config = RunConfig(
            pair=pair,
            tree=TreeConfig(**TREES[tree]),
            engine=engine,
            prompts=PromptSpec(file=str(prompts)),
            max_new_tokens=8,
        )
        run_study(config, out / "runs" / name, overwrite=True, progress=False, batch_size=batch)
        print("measured", name, flush=True)
    specs = {
        "paper": TreeConfig(policy="paper").shape(),
        "chain6": TreeConfig(policy="chain", depth=6).shape(),
        "wide": TreeShape.parse("[(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0), (0, 1)]"),
        "dynamic": DynamicTree(12, 4, 3),
        "dynamic-wide": DynamicTree(20, 3, 5),
    }
    settings = {
        "greedy": DecodeConfig(max_new_tokens=20),
        "greedy-stop": DecodeConfig(max_new_tokens=20, min_path_prob=0.2),
        **{
            f"sample-{seed}": DecodeConfig(max_new_tokens=20, temperature=0.8, top_p=0.9, seed=seed)
            for seed in range(3)
        },
        "sample-stop": DecodeConfig(max_new_tokens=20, temperature=0.5, seed=4, min_path_prob=0.1),
    }
    decoded = {}
    for arch in ARCHS:
        for dtype in ("float32", "int8"):
            pair = load_pair(
                PairConfig(
                    draft=str(dirs[arch, "draft"]),
                    target=str(dirs[arch, "target"]),
                    **DTYPES[dtype],
                )
            )
            decoder = SpeculativeDecoder(pair.draft.model, pair.target.model, pair.vocab_size)
            for i, text in enumerate(DECODE_PROMPTS):
                ids = pair.tokenizer(text)["input_ids"]
                for spec_name, spec in specs.items():
                    for setting, config in settings.items():
                        result = decoder.generate(ids, spec, config)
                        decoded[f"{arch}.{dtype}.p{i}.{spec_name}.{setting}"] = {
                            "tokens": result.tokens,
                            "stop": result.stop_reason,
                            "steps": [
                                (s.tree_size, s.accepted_len, s.emitted_token) for s in result.steps
                            ],
                        }
    (out / "decoded.json").write_text(json.dumps(decoded))
    print(f"decoded {len(decoded)} requests", flush=True)


def differences(a_dir: Path, b_dir: Path) -> list[str]:
    """What differs between two runs' records (every column but timings and the run id)."""
    from specscope.records import TIMING_COLUMNS, load_run

    tables = []
    for root in (a_dir, b_dir):
        run = load_run(root)
        tables.append(
            [
                t.drop(columns=[c for c in TIMING_COLUMNS if c in t] + ["run_id"])
                .sort_values([c for c in ("prompt_id", "step", "node_id") if c in t])
                .reset_index(drop=True)
                for t in (run.nodes, run.steps, run.prompts)
            ]
        )
    notes = []
    for kind, a, b in zip(("nodes", "steps", "prompts"), *tables):
        if a.shape != b.shape:
            notes.append(f"{kind}: {a.shape} vs {b.shape} rows x columns")
            continue
        for column in a.columns:
            x, y = a[column], b[column]
            if x.dtype.kind == "f":
                if not np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True):
                    diff = np.nanmax(np.abs(x.to_numpy() - y.to_numpy()), initial=0.0)
                    notes.append(f"{kind}.{column} max |diff| {diff:.2e}")
            elif not x.astype(str).equals(y.astype(str)):
                rows = int((x.astype(str) != y.astype(str)).sum())
                notes.append(f"{kind}.{column}: {rows} rows differ")
    return notes


def compare(before: Path, after: Path) -> None:
    """Every run under both ``runs/`` folders, and the decoded requests where both have them."""
    from specscope.records import load_run

    names = sorted(
        {p.name for p in (before / "runs").iterdir()} & {p.name for p in (after / "runs").iterdir()}
    )
    identical = 0
    for name in names:
        notes = differences(before / "runs" / name, after / "runs" / name)
        identical += not notes
        nodes = len(load_run(after / "runs" / name).nodes)
        print(f"{name:<34} {nodes:5d} nodes  " + ("identical" if not notes else "; ".join(notes)))
    print(f"{identical}/{len(names)} configs give identical records (every column but timings)")
    if not ((before / "decoded.json").is_file() and (after / "decoded.json").is_file()):
        return
    a = json.loads((before / "decoded.json").read_text())
    b = json.loads((after / "decoded.json").read_text())
    assert a.keys() == b.keys()
    tokens = sum(a[k]["tokens"] != b[k]["tokens"] for k in a)
    steps = sum(a[k]["steps"] != b[k]["steps"] or a[k]["stop"] != b[k]["stop"] for k in a)
    print(
        f"decoding: {len(a)} requests (2 archs x float32/int8 x 3 prompts x 5 trees x 6 "
        f"settings); {tokens} with other tokens, {steps} with other steps"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    write(args.out) if args.command == "write" else compare(args.before, args.after)


if __name__ == "__main__":
    main()
