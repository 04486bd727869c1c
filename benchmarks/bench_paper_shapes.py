"""Batched measurement at the paper pair's shapes, on randomly initialised models (for a GPU).

    python benchmarks/bench_paper_shapes.py [--sizes 1 2 4 8 16 32 64] [--device cuda]
    python benchmarks/bench_paper_shapes.py --tiny --device cpu --sizes 1 4   # a smoke run

A TinyLlama-1.1B config drafts for a Llama-2-7B config (bf16, the paper tree, 512-token prompts of
random ids, 64 steps per prompt). For each batch size B, B prompts are measured together by the
batched measurement exactly as ``specscope run`` measures them (one batched draft call per depth, one
target pass per step, each row's node records and certificates), and the script prints nodes per
second and the projected time of the paper's study (99,768 nodes; the paper took 11,027 s on two
T4s). Weights do not change the time: every pass does the same arithmetic whatever the values (no
step ends early, as no prompt stops at EOS here). Model builds and one warm-up step per batch size
are not timed.
"""

from __future__ import annotations

import argparse
import time

import torch

from specscope.core.batch import Batch, Row
from specscope.measure.checks import check_batch_memory
from specscope.measure.records import certificate_records, step_record
from specscope.models.config import LoadedModel, ModelPair
from specscope.theory import CriteriaConfig
from specscope.trees import TreeConfig

PAPER_NODES, PAPER_SECONDS = 99_768, 11_027

# the configs of TinyLlama/TinyLlama-1.1B-Chat-v1.0 and meta-llama/Llama-2-7b-hf
SHAPES = {
    "draft": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
    ),
    "target": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
    ),
}
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def build(role: str, tiny: bool, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        **(TINY if tiny else SHAPES[role]),
    )
    torch.manual_seed({"draft": 0, "target": 1}[role])
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # weights are created (and randomly initialised) in place
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.set_attn_implementation("sdpa")
    return model.eval()


def measure(
    engine: Batch, contexts: list[list[int]], steps: int, shape, criteria: CriteriaConfig
) -> int:
    """``steps`` steps of every row, with each row's records; returns the nodes measured."""
    engine.refill([], [Row(list(c), None) for c in contexts])
    nodes = 0
    for _ in range(steps):
        for row, scores in zip(engine.rows, engine.score(shape)):
            record = step_record(scores, shape)
            certificate_records(scores, shape, criteria)
            row.context.append(record.emitted_token)
            nodes += len(shape)
    return nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument(
        "--tiny", action="store_true", help="2-layer models of width 64 (a smoke run)"
    )
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    draft, target = (build(role, args.tiny, args.device, dtype) for role in ("draft", "target"))
    pair = ModelPair(
        LoadedModel(draft, None, "random", "random"),
        LoadedModel(target, None, "random", "random"),
        vocab_size=32000,
    )
    shape, criteria = TreeConfig(policy="paper").shape(), CriteriaConfig()
    gen = torch.Generator().manual_seed(0)
    name = "tiny models" if args.tiny else "TinyLlama-1.1B -> Llama-2-7B shapes"
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(
        f"{name}, {args.dtype}, paper tree ({len(shape)} nodes), {args.prompt_tokens}-token "
        f"prompts, {args.steps} steps, on {device}",
        flush=True,
    )
    rows = []
    for size in args.sizes:
        check_batch_memory(pair, size, args.prompt_tokens + args.steps, len(shape))
        contexts = torch.randint(0, 32000, (size, args.prompt_tokens), generator=gen).tolist()
        engine = Batch(draft, target, 32000)
        with torch.inference_mode():
            measure(engine, contexts, 1, shape, criteria)  # warm-up: kernels, allocator
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            nodes = measure(engine, contexts, args.steps, shape, criteria)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        rate = nodes / wall
        rows.append((size, nodes, wall, rate))
        print(
            f"B={size:<3} {nodes} nodes in {wall:7.2f} s = {rate:8.1f} nodes/s; the paper's "
            f"study would take {PAPER_NODES / rate:7.1f} s",
            flush=True,
        )
        del engine
    print(f"\n| batch | nodes | seconds | nodes/s | projected {PAPER_NODES:,}-node study |")
    print("|---:|---:|---:|---:|---:|")
    for size, nodes, wall, rate in rows:
        print(
            f"| {size} | {nodes} | {wall:.2f} | {rate:.1f} | {PAPER_NODES / rate:.0f} s "
            f"({PAPER_SECONDS / (PAPER_NODES / rate):.0f}x the paper's {PAPER_SECONDS:,} s) |"
        )


if __name__ == "__main__":
    main()
