#!/usr/bin/env bash
# The drafter decisions in bfloat16 at the int8 study's size, as shipped in
# results/demo-pair/drafters-bf16-full/ (30 tuning prompts per domain, 20 held out x 3 repeats:
# bash scripts/drafter_decisions_bf16.sh). The study (drafter_study.sh), tune over its two runs,
# a bench of that policy on 20 held-out prompts per domain x REPEATS (default 3: about 2.6 hours,
# the tune 10 minutes more, on 2 CPU cores), and a bench on the tuning prompts set beside the replay of
# exactly those prompts. 2 threads; run the tune and the benches with nothing else on the
# machine, and on another machine remove policy.json and the bench files first (tune times this
# machine). Resumable: every step whose output exists is skipped; an interrupted bench resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
sweep=${1:-results/demo-pair/drafters-bf16-full-sweep.toml}
out=${2:-results/demo-pair/drafters-bf16-full}
repeats=${3:-3}
name=$(basename "$out")
bash scripts/drafter_study.sh "$sweep" "runs/$name" "$out"
[ -f "$out/policy.json" ] || specscope tune "$out/draft-model" "$out/ngram" --threads 2 \
  --max-depth 4 --repeats 5 -o "$out/policy.json"
# the chain length the policy chose most often for the draft model (chain and assisted time it)
k=$(python -c 'import collections, json, sys
p = json.load(open(sys.argv[1]))
depths = [e["nodes"] for e in [*p["domains"].values(), p["uniform"]] if "drafter" not in e and e["nodes"]]
print(collections.Counter(depths).most_common(1)[0][0] if depths else 3)' "$out/policy.json")
held="$out/bench-heldout.json"  # (a bench whose .partial.jsonl is left was interrupted: it resumes)
[ -f "$held" ] && [ ! -f "$held.partial.jsonl" ] ||
  specscope bench --policy-file "$out/policy.json" --methods plain,chain,ngram,assisted,routed \
  --assisted-tokens $k --prompt-lookup-min 2 --prompt-lookup-max 4 --chain-depth $k --threads 2 \
  --per-domain 20 --max-new-tokens 48 --repeats "$repeats" --warmup 1 --out "$held"
python scripts/bench_conclude.py "$held" --with-routed --update --out "$out/summary-heldout.md"
[ -f "$out/bench-tuning.json" ] ||
  specscope bench --policy-file "$out/policy.json" --methods plain,chain,ngram,assisted \
  --assisted-tokens $k --prompt-lookup-min 2 --prompt-lookup-max 4 --chain-depth $k --threads 2 \
  --tuning-prompts --per-domain 2 --max-new-tokens 48 --repeats 1 --warmup 1 \
  --out "$out/bench-tuning.json"
python scripts/same_prompts.py "$out/bench-tuning.json" --out "$out/same-prompts.md"
