#!/usr/bin/env bash
# The drafter study, as shipped in results/demo-pair/drafters/: the draft model and n-gram lookup
# (vLLM's rule), each a chain of 4, and llama.cpp's ngram-simple (N = 3, a chain of 16),
# on the same 30 prompts per domain (results/demo-pair/drafters-sweep.toml), int8 in batches of 8;
# then every record shipped (zstd) and the comparison made from the shipped files. Resumable: run
# it again after an interruption. About an hour on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/demo-pair/drafters
specscope sweep results/demo-pair/drafters-sweep.toml --out runs/drafters
# llama.cpp's ngram-simple on the same prompts, N = 3 and M = 16 (a chain of 16; its records
# replay every M' from 3 to 16). At llama.cpp's defaults (N = 12, M = 48) llama-server drafted 45
# tokens over 12 of these prompts' kind at 64 tokens, none accepted: nothing to tune.
specscope run --config demo --int8 --batch-size 8 --per-domain 30 --max-new-tokens 48 \
  --drafter llama-ngram-simple --ngram-size 3 --policy chain --depth 16 \
  --out runs/drafters/runs/llama-ngram-simple
for drafter in draft-model ngram llama-ngram-simple; do
  src=runs/drafters/runs/$drafter dst=$out/$drafter
  mkdir -p "$dst"
  cp "$src/manifest.json" "$src/prompts.parquet" "$dst/"
  for table in steps nodes; do
    python -c 'import sys, pyarrow.parquet as pq
pq.write_table(pq.read_table(sys.argv[1]), sys.argv[2], compression="zstd", compression_level=19)' \
      "$src/$table.parquet" "$dst/$table.parquet"
  done
done
cp runs/drafters/sweep.json "$out/sweep.json"
specscope compare --by-drafter "$out/draft-model" "$out/ngram" "$out/llama-ngram-simple" \
  --out "$out/analysis"
