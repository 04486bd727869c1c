"""The largest sizes, counts and depths specscope accepts, in one place: command-line options, run
configs, policy files and exports all check against these before any work, and name the range.

Each bound is a sane maximum: a value at the bound still runs in bounded memory and time, and no
real use needs more. Bounds that depend on the model (a tree must fit the model's positions with the
prompt and the new tokens, an early exit must leave a layer out) are checked where the model is
known: :func:`specscope.trees.check_depth_fits`,
:meth:`specscope.drafters.DrafterConfig.check_target_layers`.

This module imports nothing, so that the command line can declare its options with it.
"""

from __future__ import annotations

# Nodes of one draft tree, and so its depth, roots and children per node: the ancestor mask is
# N^2 bytes (16 MiB at the bound), every step feeds N tokens to the target, and the largest
# published trees (Sequoia's) have under 1,000 nodes.
MAX_TREE_NODES = 4096

# Trees tuning weighs (tune --max-nodes, --max-depth): its dynamic programme is quadratic in the
# node budget for every depth, and every candidate is priced; at both bounds one domain took 47 s
# with 4 sibling ranks on a shared 2-core CPU (32 nodes, depth 8, the defaults: 0.1 s).
MAX_TUNE_NODES = 256
MAX_TUNE_DEPTH = 64

# CPU threads of torch (--threads of run, sweep, decode, tune, bench): torch.set_num_threads
# overflows past a C int, and no CPU this runs on has more.
MAX_THREADS = 1024

# Tokens generated, or kept of a prompt (2^24): more than any model's context; the model's own
# limit is checked once it is known.
MAX_TOKENS = 1 << 24

# Seeds: numpy takes 0 .. 2^32 - 1 (torch up to 2^64 - 1).
MAX_SEED = 2**32 - 1

# Prompts sampled per domain, or measured together in one batch.
MAX_PROMPTS = 1_000_000
MAX_BATCH = 1 << 16

# Grid points a sweep may expand (--max-points: each is a run config in memory), and Ray's
# retries of a shard whose worker died.
MAX_GRID = 1_000_000
MAX_RETRIES = 100

# Bootstrap resamples: the resampling weights are (resamples x prompts) doubles.
MAX_BOOT = 100_000

# A threshold on counts (tune --min-count): above every count, each cell counts as 0.
MAX_COUNT = 1_000_000_000

# Timed repetitions and warm-up rounds of one measurement.
MAX_REPEATS = 1000

# n-gram lookup lengths (prompt_lookup_min/max): engines take any positive 32-bit integer, but a
# longer match needs as long a repeat in the context, and the lookup's work grows with it.
MAX_NGRAM = 1024

# An early exit's layers, before the target is known (then: 1 .. its layers - 1).
MAX_LAYERS = 1024


def out_of_range(name: str, value: int, low: int, high: int) -> str | None:
    """Why the number ``value`` is not in ``low..high``, naming the range, or None."""
    if value < low:
        return f"{name} must be >= {low}, got {value!r}"
    if value > high:
        return f"{name} must be in {low}..{high}, got {value!r}"
    return None
