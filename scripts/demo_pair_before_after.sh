#!/usr/bin/env bash
# The demo pair's records before and after a restructuring, on held-out prompts (seed 7, not the
# preset's 42): 2 prompts per domain x 16 tokens, int8 and bfloat16, batch sizes 1 and 4, each
# checkout measured by its own code (PYTHONPATH), then compared column by column.
#
#     scripts/demo_pair_before_after.sh OLD/src NEW/src OUT
#
# CPU-heavy (the demo weights): run it under `nice -n 19` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1 after=$2 out=$3
for side in before after; do
  src=$([ "$side" = before ] && echo "$before" || echo "$after")
  for dtype in int8 bfloat16; do
    flags=$([ "$dtype" = int8 ] && echo "--int8" || echo "--dtype bfloat16")
    for batch in 1 4; do
      # shellcheck disable=SC2086
      PYTHONPATH=$src python -m specscope.cli run --config demo $flags --per-domain 2 --seed 7 \
        --max-new-tokens 16 --batch-size "$batch" --quiet --out "$out/$side/runs/$dtype.b$batch"
    done
  done
done
python scripts/records_before_after.py compare "$out/before" "$out/after"
