"""Check specscope's speculation paths on one device (a GPU, or the CPU) with tiny random models.

For tiny random-weight Llama and Qwen2 pairs (a target and a draft near it: every weight times
1 + 0.05 noise), in float32 and bfloat16 on ``--device``, it checks:

1. tree: the target's logits from the one-pass tree verification (``Speculator.verify``, over
   the KV cache, after prefill, drafting and commits) equal, at every node, those of a plain
   causal forward of the context + the node's root-to-node path (float32: max |diff| < 1e-4;
   bfloat16: the same argmax wherever the reference's top-2 margin is clear);
2. decode: speculative greedy decoding (``make_decoder``) gives plain greedy decoding's tokens
   (``plain_generate``), for a chain of 4, the paper tree and the model-free n-gram drafter;
3. batch: measurement's records (``measure_rows``: steps, accepted lengths, node tokens and
   figures) of 4 prompts measured in one batch equal those of the prompts measured one at a time,
   for the paper tree and the n-gram drafter (a prompt's records may part only at a near tie of
   the logits, where the batched kernels' rounding can flip a choice: bfloat16);
4. cpu: the same pair and prompts, decoded greedily in float32 on the CPU and on the device,
   give the same tokens (a difference at a near tie of the target's logits is reported, not
   failed). Skipped when the device is the CPU.

It prints a table of PASS/FAIL with figures and exits 1 if any check fails. It imports only the
library modules it needs (no CLI). Run from the repository root:

    PYTHONPATH=src python scripts/device_check.py --device cuda
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import pandas as pd
import torch
import transformers

from specscope.core.draft import ChildRule
from specscope.core.loop import DecodeConfig, DecodeResult, Speculator, plain_generate
from specscope.decode import GreedyAcceptor, make_decoder, tokens_per_step
from specscope.drafters import DrafterConfig
from specscope.measure.study import PromptRecords, PromptState, measure_rows, start_prompts
from specscope.models.config import LoadedModel, ModelPair
from specscope.models.tiny import byte_tokenizer, near_pair
from specscope.prompts.items import PromptItem, user_message
from specscope.records import TIMING_COLUMNS
from specscope.run.config import RunConfig
from specscope.trees import TreeConfig, TreeShape

ARCHS = ("llama", "qwen2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROMPTS = (
    "the cat sat on the mat. the cat sat on the mat. the cat",
    "def add(a, b):\n    return",
    "Why?",
    "one two three, one two three, one two",
)
NGRAM = DrafterConfig("ngram", prompt_lookup_min=1, prompt_lookup_max=3)  # proposes often
CHAIN4 = TreeConfig(policy="chain", depth=4)
PAPER = TreeConfig(policy="paper")  # 8 nodes, depth 3, two children per node
DRAFTERS = {  # case -> (drafter, tree)
    "chain4": (DrafterConfig(), CHAIN4),
    "paper-tree": (DrafterConfig(), PAPER),
    "ngram-chain4": (NGRAM, CHAIN4),
}
BATCH_CASES = ("paper-tree", "ngram-chain4")  # check 3
NEW_TOKENS = 24  # decoding (checks 2 and 4)
MEASURE_TOKENS = 8  # measurement (check 3)
TREE_STEPS = 3  # verification steps per prompt (check 1)
LOGIT_ATOL = 1e-4  # check 1 in float32
# a top-2 logit margin below this is a near tie: rounding may flip the argmax there
CLEAR_MARGIN = {torch.float32: 1e-3, torch.bfloat16: 0.25}
# measurement's float figures (probabilities, entropies, KL) across batch sizes, and how far
# target ranks may move (bfloat16 reorders near-tied tokens far down a row), as tests/test_measure.py
RECORD_ATOL = {torch.float32: (1e-5, 0), torch.bfloat16: (2e-2, 8)}
STEP_KEYS = ["prompt_id", "step"]
NODE_VALUES = ["token_id", "greedy_accept"]  # node records that must be equal
FLOAT_NODE_COLUMNS = ["p_target", "target_entropy", "target_margin", "p_draft", "kl_target_draft"]
STEP_VALUES = ["emitted_token", "accepted_len", "tau", "context_len"]  # step records, likewise


@dataclass
class Outcome:
    """One line of the table: ok None means skipped."""

    check: str
    arch: str
    dtype: str
    case: str
    ok: bool | None
    figures: str


# --- tiny models ----------------------------------------------------------------------------


def device_pair(arch: str, tokenizer, dtype: torch.dtype, device: str) -> ModelPair:
    """The tiny near pair (``specscope.models.tiny.near_pair``: noise 0.05) as a
    :class:`ModelPair` drafting with the draft model. Built on the CPU in float32 from fixed
    seeds, so every device and dtype gets the same weights."""
    draft, target = near_pair(arch, len(tokenizer))
    loaded = [
        LoadedModel(m.to(device=device, dtype=dtype), tokenizer, f"tiny-{arch}-{role}", "memory")
        for m, role in ((draft, "draft"), (target, "target"))
    ]
    return ModelPair(*loaded, vocab_size=len(tokenizer))


def drafting(pair: ModelPair, case: str) -> tuple[ModelPair, TreeConfig]:
    """``pair`` drafting with the drafter of ``case`` (a model-free one: without its draft
    model, as :func:`specscope.models.load_pair` loads it), and the case's tree."""
    drafter, tree = DRAFTERS[case]
    if drafter.kind != "draft-model":
        pair = replace(pair, draft=None)
    return replace(pair, drafter=drafter), tree


def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


# --- figures --------------------------------------------------------------------------------


def margin(logits: torch.Tensor) -> float:
    """The top-1 minus top-2 logit."""
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


@torch.inference_mode()
def last_logits(model: torch.nn.Module, ids: list[int], vocab: int) -> torch.Tensor:
    """A plain causal forward of ``ids`` without a cache: float32 logits [vocab] after the last."""
    out = model(input_ids=torch.tensor([ids], device=model.device))
    return out.logits[0, -1, :vocab].float()


def first_difference(
    a: list[int], b: list[int], model: torch.nn.Module, prompt: list[int], vocab: int
) -> tuple[int, float] | None:
    """Where two outputs of ``prompt`` first differ, and the model's top-2 margin there (None
    where they are equal)."""
    if a == b:
        return None
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return i, margin(last_logits(model, prompt + a[:i], vocab))


def same_or_near_tie(
    a: list[int], b: list[int], model: torch.nn.Module, prompt: list[int], vocab: int
) -> tuple[bool, str]:
    """(ok, note): ``a`` and ``b`` are equal, or first differ where ``model`` nearly ties."""
    diff = first_difference(a, b, model, prompt, vocab)
    if diff is None:
        return True, ""
    i, m = diff
    near = m < CLEAR_MARGIN[model.dtype]
    return near, f"differ at token {i} (margin {m:.2g}{', near tie' if near else ''})"


# --- check 1: the tree pass ----------------------------------------------------------------


def path_to(shape: TreeShape, node: int) -> list[int]:
    """The nodes from a root down to ``node``."""
    path = []
    while node >= 0:
        path.append(node)
        node = shape.parents[node]
    return path[::-1]


@torch.inference_mode()
def tree_diffs(
    pair: ModelPair, prompt: list[int], shape: TreeShape
) -> Iterator[tuple[float, float, bool]]:
    """(|tree - reference| max, reference margin, argmax equal) at every context of
    ``TREE_STEPS`` steps: the context and each node, drafted and verified as decoding does."""
    vocab = pair.vocab_size
    spec = Speculator(pair.draft.model, pair.target.model, vocab)
    rule = ChildRule(vocab)
    s, first = spec.prefill(prompt, seed=0)
    s.tokens.append(int(first.argmax()))
    for _ in range(TREE_STEPS):
        tree = spec.draft_tree(s, shape, rule)
        logits = spec.verify(s, tree).float()
        tokens = tree.tokens.tolist()
        for row in range(1 + len(shape)):
            path = [] if row == 0 else [tokens[n] for n in path_to(shape, row - 1)]
            ref = last_logits(pair.target.model, s.tokens + path, vocab)
            diff = float((logits[row] - ref).abs().max())
            yield diff, margin(ref), bool(logits[row].argmax() == ref.argmax())
        spec.commit_path(s, tree, GreedyAcceptor(rule).accept(s, tree, logits))


def check_tree(pair: ModelPair, prompts: list[list[int]]) -> tuple[bool, str]:
    rows = [d for prompt in prompts for d in tree_diffs(pair, prompt, PAPER.shape())]
    worst = max(d for d, _, _ in rows)
    dtype = pair.target.model.dtype
    clear = [(m, same) for _, m, same in rows if m >= CLEAR_MARGIN[dtype]]
    flips = sum(not same for _, same in clear)
    figures = (
        f"{len(rows)} contexts, max|diff| {worst:.2e}, argmax flips {flips}/{len(clear)} clear"
    )
    ok = worst < LOGIT_ATOL if dtype == torch.float32 else flips == 0
    return ok, figures


# --- check 2: speculative decoding equals plain decoding ------------------------------------


def decode_plain(pair: ModelPair, prompt: list[int]) -> DecodeResult:
    return plain_generate(pair.target.model, prompt, DecodeConfig(NEW_TOKENS), pair.vocab_size)


def check_decode(pair: ModelPair, prompts: list[list[int]], case: str) -> tuple[bool, str]:
    pair, tree = drafting(pair, case)
    decoder = make_decoder(pair)
    results, notes, ok = [], [], True
    for i, prompt in enumerate(prompts):
        spec = decoder.generate(prompt, tree.shape(), DecodeConfig(NEW_TOKENS))
        same, note = same_or_near_tie(
            spec.tokens,
            decode_plain(pair, prompt).tokens,
            pair.target.model,
            prompt,
            pair.vocab_size,
        )
        ok &= same
        notes += [f"prompt {i}: {note}"] if note else []
        results.append(spec)
    per_step = sum(tokens_per_step(r) for r in results) / len(results)
    return ok, "; ".join([f"{per_step:.2f} tokens/step over {len(prompts)} prompts", *notes])


# --- check 3: batched measurement equals one prompt at a time -------------------------------


@dataclass
class Measured:
    """One measurement's step and node records (no timings) and each prompt's final context."""

    steps: pd.DataFrame
    nodes: pd.DataFrame
    contexts: dict[str, list[int]]


def frame(records: dict[str, PromptRecords], table: str) -> pd.DataFrame:
    """One table of every prompt's records, without timings, in a fixed row order."""
    df = pd.concat([getattr(r, table).to_pandas() for r in records.values()])
    df = df.drop(columns=[c for c in TIMING_COLUMNS if c in df])
    keys = STEP_KEYS + (["node_id"] if table == "nodes" else [])
    return df.sort_values(keys).reset_index(drop=True)


def measure(pair: ModelPair, config: RunConfig, batch_size: int) -> Measured:
    """The prompts' records, measured ``batch_size`` prompts at a time."""
    items = [(i, PromptItem(f"p{i}", "chat", user_message(t))) for i, t in enumerate(PROMPTS)]
    states = start_prompts(pair, config, items)
    records: dict[str, PromptRecords] = {}

    def commit(state: PromptState, prompt_records: PromptRecords) -> None:
        records[state.item.id] = prompt_records

    measure_rows(pair, states, config, config.tree.shape(), "device-check", batch_size, commit)
    contexts = {s.item.id: list(s.context) for s in states}
    return Measured(frame(records, "steps"), frame(records, "nodes"), contexts)


def differing(merged: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The rows of an outer merge (suffixes _a, _b) where a column differs or a side is missing."""
    mask = np.zeros(len(merged), dtype=bool)
    for c in columns:
        mask |= (merged[f"{c}_a"] != merged[f"{c}_b"]).to_numpy()
    return merged[mask]


def tie_margin(
    pair: ModelPair, a: Measured, nodes: pd.DataFrame, shape: TreeShape, prompt: str, step: int
) -> tuple[str, float]:
    """Where two measurements of ``prompt`` first differ at ``step``, and the logit margin of the
    choice that differs: a node's token (the draft's logits of the two tokens, at the node's
    parent context), a node's greedy acceptance (the target's top-2 there), else the emitted
    token (the target's top-2 at the step's context)."""
    row = a.steps[(a.steps.prompt_id == prompt) & (a.steps.step == step)].iloc[0]
    context = a.contexts[prompt][: int(row.context_len)]
    here = nodes[(nodes.prompt_id == prompt) & (nodes.step == step)].set_index("node_id")
    vocab = pair.vocab_size
    for n, node in here.iterrows():
        parent = shape.parents[int(n)]
        path = [int(here.token_id_a[m]) for m in path_to(shape, parent)] if parent >= 0 else []
        if node.token_id_a != node.token_id_b:
            if pair.draft is None:  # a lookup's chain depends on the context alone
                return f"step {step} node {n}: lookup tokens", float("inf")
            logits = last_logits(pair.draft.model, context + path, vocab)
            gap = abs(float(logits[int(node.token_id_a)] - logits[int(node.token_id_b)]))
            return f"step {step} node {n}: draft tokens", gap
        if node.greedy_accept_a != node.greedy_accept_b:
            logits = last_logits(pair.target.model, context + path, vocab)
            return f"step {step} node {n}: target argmax", margin(logits)
    logits = last_logits(pair.target.model, context, vocab)
    return f"step {step}: emitted token", margin(logits)


def compare_records(
    pair: ModelPair, a: Measured, b: Measured, shape: TreeShape
) -> tuple[bool, str]:
    """Records equal up to each prompt's first difference, which must sit at a near tie (the
    batched kernels round differently); the figures before it within the dtype's tolerance."""
    steps = a.steps.merge(b.steps, on=STEP_KEYS, how="outer", suffixes=("_a", "_b"))
    nodes = a.nodes.merge(b.nodes, on=[*STEP_KEYS, "node_id"], how="outer", suffixes=("_a", "_b"))
    first = (
        pd.concat([differing(steps, STEP_VALUES), differing(nodes, NODE_VALUES)])
        .groupby("prompt_id")
        .step.min()
        .to_dict()
    )
    dtype = pair.target.model.dtype
    ok, notes = True, []
    for prompt, step in sorted(first.items()):
        where, gap = tie_margin(pair, a, nodes, shape, prompt, int(step))
        near = gap < CLEAR_MARGIN[dtype]
        ok &= near
        notes.append(f"{prompt} {where} differ (margin {gap:.2g}{', near tie' if near else ''})")
    same = nodes[nodes.step < nodes.prompt_id.map(first).fillna(np.inf)]
    x, y = (same[[f"{c}_{side}" for c in FLOAT_NODE_COLUMNS]].to_numpy(float) for side in "ab")
    same_nans = bool((np.isnan(x) == np.isnan(y)).all())  # KL is NaN for point-mass proposals
    worst = float(np.nanmax(np.abs(x - y), initial=0.0))
    rank = int((same.target_rank_a - same.target_rank_b).abs().max())
    atol, rank_atol = RECORD_ATOL[dtype]
    ok &= same_nans and worst <= atol and rank <= rank_atol
    figures = [
        f"{len(a.steps)} steps, {len(a.nodes)} nodes, mean accepted_len "
        f"{a.steps.accepted_len.mean():.2f}; {len(PROMPTS) - len(first)}/{len(PROMPTS)} prompts "
        f"equal throughout; before any difference: max|diff| {worst:.1e}, rank diff {rank}"
        + ("" if same_nans else ", NaNs DIFFER"),
        *notes,
    ]
    return ok, "; ".join(figures)


def check_batch(pair: ModelPair, case: str) -> tuple[bool, str]:
    pair, tree = drafting(pair, case)
    config = RunConfig(tree=tree, drafter=pair.drafter, max_new_tokens=MEASURE_TOKENS)
    one = measure(pair, config, batch_size=1)
    many = measure(pair, config, batch_size=len(PROMPTS))
    return compare_records(pair, one, many, tree.shape())


# --- check 4: the device agrees with the CPU ------------------------------------------------


def check_cpu(pair: ModelPair, cpu_pair: ModelPair, prompts: list[list[int]]) -> tuple[bool, str]:
    ok, notes = True, []
    for i, prompt in enumerate(prompts):
        same, note = same_or_near_tie(
            decode_plain(pair, prompt).tokens,
            decode_plain(cpu_pair, prompt).tokens,
            cpu_pair.target.model,
            prompt,
            pair.vocab_size,
        )
        ok &= same
        notes += [f"prompt {i}: {note}"] if note else []
    return ok, "; ".join(notes) or f"same {NEW_TOKENS} tokens for all {len(prompts)} prompts"


# --- driver ---------------------------------------------------------------------------------


def attempt(
    check: str, arch: str, dtype: str, case: str, run: Callable[[], tuple[bool, str]]
) -> Outcome:
    """Run one check; an exception is a failure, its traceback printed to stderr."""
    try:
        ok, figures = run()
    except Exception as e:  # every failure is reported; the other checks go on
        traceback.print_exc()
        ok, figures = False, f"{type(e).__name__}: {e}"
    outcome = Outcome(check, arch, dtype, case, ok, figures)
    print(f"  {check} {arch} {dtype} {case}: {'PASS' if ok else 'FAIL'}", flush=True)
    return outcome


def run_checks(device: str) -> list[Outcome]:
    tokenizer = byte_tokenizer()
    prompts = prompt_ids(tokenizer)
    outcomes = []
    for arch in ARCHS:
        for name, dtype in DTYPES.items():
            pair = device_pair(arch, tokenizer, dtype, device)
            cases = [("1 tree", "paper-tree", partial(check_tree, pair, prompts))]
            cases += [("2 decode", c, partial(check_decode, pair, prompts, c)) for c in DRAFTERS]
            cases += [("3 batch", c, partial(check_batch, pair, c)) for c in BATCH_CASES]
            if dtype == torch.float32 and device != "cpu":
                cpu_pair = device_pair(arch, tokenizer, dtype, "cpu")
                cases.append(("4 cpu", "plain", partial(check_cpu, pair, cpu_pair, prompts)))
            outcomes += [attempt(check, arch, name, case, run) for check, case, run in cases]
            if dtype == torch.float32 and device == "cpu":
                outcomes.append(Outcome("4 cpu", arch, name, "plain", None, "device is the CPU"))
    return outcomes


def print_table(outcomes: list[Outcome]) -> None:
    label = {True: "PASS", False: "FAIL", None: "SKIP"}
    rows = [(o.check, o.arch, o.dtype, o.case, label[o.ok], o.figures) for o in outcomes]
    header = ("check", "arch", "dtype", "case", "result", "figures")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    versions = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    print(f"device {args.device} ({where}); {versions}; transformers {transformers.__version__}")
    outcomes = run_checks(args.device)
    print_table(outcomes)
    failed = [o for o in outcomes if o.ok is False]
    print(f"{len(failed)} of {len(outcomes)} checks failed" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
