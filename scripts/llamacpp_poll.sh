#!/usr/bin/env bash
# llama-server's --poll tuned beside the spec types: plain and the lookups at llama.cpp's default
# poll (50) and at poll 0, tuned on the deep tree's prompts (10 per domain), then the policy
# benched on 20 held-out prompts per domain, one repeat at a time (the bench resumes; run
# scripts/llamacpp_conclude.py results/demo-pair/llamacpp/poll --per-domain 20 --more-repeats 1
# for each further repeat). Run on an otherwise idle machine.
set -euo pipefail
out=results/demo-pair/llamacpp/poll
if [ ! -f "$out/policy.json" ]; then
  specscope llamacpp results/demo-pair/deep-tree --out "$out" --tune-per-domain 10 --tune-only \
    --cost-grid results/demo-pair/llamacpp/policy-costs.json \
    --candidate plain --candidate plain:poll=0 --candidate draft-simple:k=2 \
    --candidate ngram-simple --candidate ngram-map-k --candidate ngram-mod \
    --candidate ngram-map-k:poll=0 --candidate ngram-mod:poll=0
fi
if [ ! -f "$out/bench.json" ]; then
  specscope llamacpp results/demo-pair/deep-tree --policy-file "$out/policy.json" --out "$out" \
    --per-domain 20 --repeats "${REPEATS:-1}"
fi
