#!/usr/bin/env bash
# The drafter decisions in bfloat16 at a reduced size, as shipped in results/demo-pair/drafters-bf16/:
# the study on 10 prompts per domain (results/demo-pair/drafters-bf16-sweep.toml), tune over its two
# runs, a bench of that policy on 8 held-out prompts per domain x 1 repeat, and a bench on the
# tuning prompts set beside the replay of exactly those prompts. 2 threads; run the tune and the
# benches with nothing else on the machine. Resumable up to the tune.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/demo-pair/drafters-bf16
specscope sweep results/demo-pair/drafters-bf16-sweep.toml --out runs/drafters-bf16
for drafter in draft-model ngram; do
  src=runs/drafters-bf16/runs/$drafter dst=$out/$drafter
  mkdir -p "$dst"
  cp "$src/manifest.json" "$src/prompts.parquet" "$dst/"
  for table in steps nodes; do
    python -c 'import sys, pyarrow.parquet as pq
pq.write_table(pq.read_table(sys.argv[1]), sys.argv[2], compression="zstd", compression_level=19)' \
      "$src/$table.parquet" "$dst/$table.parquet"
  done
done
specscope tune "$out/draft-model" "$out/ngram" --threads 2 --max-depth 4 --repeats 5 \
  -o "$out/policy.json"
specscope bench --policy-file "$out/policy.json" --methods plain,chain,ngram,assisted,routed \
  --assisted-tokens 3 --prompt-lookup-min 2 --prompt-lookup-max 4 --chain-depth 3 --threads 2 \
  --per-domain 8 --max-new-tokens 48 --repeats 1 --warmup 1 --out "$out/bench-heldout.json"
specscope bench --policy-file "$out/policy.json" --methods plain,chain,ngram,assisted \
  --assisted-tokens 3 --prompt-lookup-min 2 --prompt-lookup-max 4 --chain-depth 3 --threads 2 \
  --tuning-prompts --per-domain 4 --max-new-tokens 48 --repeats 1 --warmup 1 \
  --out "$out/bench-tuning.json"
python scripts/same_prompts.py "$out/bench-tuning.json" --out "$out/same-prompts.md"
