#!/usr/bin/env bash
# The drafter decisions, as shipped in results/demo-pair/drafters/: tune over the drafter study's
# two runs (scripts/drafter_study.sh), then the bench of that policy on 20 held-out prompts per
# domain x 3 repeats (chat: the 20 of its 50 offline prompts the study did not measure), then a
# bench on the tuning prompts themselves, set beside the replay of exactly those prompts.
# Int8 (float32 activations), 2 threads; run it with nothing else on the machine. About 50 s,
# 108 minutes and 10 minutes on 2 CPU cores (Intel Xeon, AVX512-BF16, AMX).
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/demo-pair/drafters
specscope tune "$out/draft-model" "$out/ngram" --threads 2 --max-depth 4 --repeats 5 \
  -o "$out/policy.json"
# chain and ngram time the chains of 3 the policy chose (routed reuses their runs), uniform its
# pooled choice; plain is transformers' generate()
specscope bench --policy-file "$out/policy.json" --methods plain,chain,ngram,uniform,routed \
  --prompt-lookup-min 2 --prompt-lookup-max 4 --chain-depth 3 --int8 --threads 2 \
  --per-domain 20 --max-new-tokens 48 --repeats 3 --warmup 1 --out "$out/bench-heldout-int8.json"
# on the tuning prompts (in-sample, labelled): tokens per step and outputs against the run's
# records (what this bench is read for; not its speeds)
specscope bench --policy-file "$out/policy.json" --methods plain,chain,ngram,uniform \
  --prompt-lookup-min 2 --prompt-lookup-max 4 --chain-depth 3 --int8 --threads 2 \
  --tuning-prompts --per-domain 5 --max-new-tokens 48 --repeats 1 --warmup 1 \
  --out "$out/bench-tuning-int8.json"
python scripts/same_prompts.py "$out/bench-tuning-int8.json" --out "$out/same-prompts-int8.md"
