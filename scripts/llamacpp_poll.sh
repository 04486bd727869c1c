#!/usr/bin/env bash
# llama-server's --poll tuned beside the spec types: plain and the lookups at llama.cpp's default
# poll (50) and at poll 0, and the draft model's K = 2 (the step model's calibration), tuned on the
# deep tree's prompts (TUNE_PER_DOMAIN per domain, default 10, the domains in turns), then the
# policy benched on 20 held-out prompts per domain, REPEATS repeats (default 1; the bench resumes:
# run scripts/llamacpp_conclude.py OUT --per-domain 20 --more-repeats 1 for each further repeat).
# OUT defaults to results/demo-pair/llamacpp/poll; COST_GRID, a llama-bench cost grid, is measured
# here when not given. Run on an otherwise idle machine.
set -euo pipefail
out=${OUT:-results/demo-pair/llamacpp/poll}
grid=()
if [ -n "${COST_GRID:-}" ]; then grid=(--cost-grid "$COST_GRID"); fi
if [ ! -f "$out/policy.json" ]; then
  specscope tune results/demo-pair/deep-tree --backend llama-server --out "$out/policy.json" \
    --tune-per-domain "${TUNE_PER_DOMAIN:-10}" "${grid[@]}" \
    --candidate plain --candidate plain:poll=0 --candidate draft-simple:k=2 \
    --candidate ngram-simple --candidate ngram-map-k --candidate ngram-mod \
    --candidate ngram-map-k:poll=0 --candidate ngram-mod:poll=0
fi
if [ ! -f "$out/bench.json" ]; then
  specscope bench --backend llama-server --policy-file "$out/policy.json" --out "$out" \
    --per-domain 20 --repeats "${REPEATS:-1}"
fi
