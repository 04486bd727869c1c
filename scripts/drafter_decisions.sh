#!/usr/bin/env bash
# The int8 drafter decisions, as shipped in results/demo-pair/drafters/decisions/: tune over the
# drafter study's two runs (scripts/drafter_study.sh) in both backends (specscope's decoder and
# transformers' assisted generation), a bench of that policy on 20 held-out prompts per domain x
# REPEATS (chat: the 20 of its 50 offline prompts the study did not measure), after a bench on
# the tuning prompts themselves set beside the replay of exactly those prompts (a few minutes:
# the same outputs and steps, checked before the long bench). Int8 (float32
# activations), 2 threads; run it with nothing else on the machine. An interrupted bench resumes
# when the script runs again (every step whose output exists, the tune included, is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
out=results/demo-pair/drafters
dec=$out/decisions
mkdir -p "$dec"
[ -f "$dec/policy.json" ] || specscope tune "$out/draft-model" "$out/ngram" --threads 2 \
  --max-depth 4 --repeats 5 -o "$dec/policy.json"
# the chain length the policy chose most often for the draft model (chain and assisted time it)
k=$(python -c 'import collections, json, sys
p = json.load(open(sys.argv[1]))
depths = [e["nodes"] for e in [*p["domains"].values(), p["uniform"]] if "drafter" not in e and e["nodes"]]
print(collections.Counter(depths).most_common(1)[0][0] if depths else 3)' "$dec/policy.json")
methods=(--prompt-lookup-min 2 --prompt-lookup-max 4 --assisted-tokens "$k" --chain-depth "$k"
  --int8 --threads 2 --max-new-tokens 48 --warmup 1)
# on the tuning prompts (in-sample, labelled): tokens per step and outputs against the run's
# records (what this bench is read for; not its speeds)
[ -f "$dec/bench-tuning.json" ] || specscope bench --policy-file "$dec/policy.json" \
  --methods plain,chain,ngram,assisted "${methods[@]}" --tuning-prompts --per-domain 3 \
  --repeats 1 --out "$dec/bench-tuning.json"
python scripts/same_prompts.py "$dec/bench-tuning.json" --out "$dec/same-prompts.md"
# the same with the draft on the row-wise attention measurement drafts with: the replay's steps exactly
[ -f "$dec/bench-tuning-rowwise.json" ] || specscope bench --policy-file "$dec/policy.json" \
  --methods plain,chain,ngram,assisted "${methods[@]}" --tuning-prompts --per-domain 3 \
  --repeats 1 --draft-attention rowwise --out "$dec/bench-tuning-rowwise.json"
python scripts/same_prompts.py "$dec/bench-tuning-rowwise.json" --out "$dec/same-prompts-rowwise.md"
# (a bench whose .partial.jsonl is left was interrupted: it resumes)
[ -f "$dec/bench-heldout.json" ] && [ ! -f "$dec/bench-heldout.json.partial.jsonl" ] ||
  specscope bench --policy-file "$dec/policy.json" \
  --methods plain,chain,ngram,assisted,routed "${methods[@]}" --per-domain 20 \
  --repeats "$repeats" --out "$dec/bench-heldout.json"
python scripts/bench_conclude.py "$dec/bench-heldout.json" --with-routed --update --out "$dec/summary-heldout.md"
