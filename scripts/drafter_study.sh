#!/usr/bin/env bash
# The drafter study, as shipped in results/demo-pair/drafters/: the draft model and n-gram lookup,
# each a chain of 4, on the same 30 prompts per domain (results/demo-pair/drafters-sweep.toml),
# int8 in batches of 8; then every record shipped (zstd) and the comparison made from the shipped
# files. Resumable: run it again after an interruption. About 45 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# Another study's files: bash scripts/drafter_study.sh SWEEP.toml RUNS_DIR OUT_DIR (the bfloat16 one:
# results/demo-pair/drafters-bf16-full-sweep.toml runs/drafters-bf16-full results/demo-pair/drafters-bf16-full).
sweep=${1:-results/demo-pair/drafters-sweep.toml} runs=${2:-runs/drafters}
out=${3:-results/demo-pair/drafters}
specscope sweep "$sweep" --out "$runs"
for drafter in draft-model ngram; do
  src=$runs/runs/$drafter dst=$out/$drafter
  mkdir -p "$dst"
  cp "$src/manifest.json" "$src/prompts.parquet" "$dst/"
  for table in steps nodes; do
    python -c 'import sys, pyarrow.parquet as pq
pq.write_table(pq.read_table(sys.argv[1]), sys.argv[2], compression="zstd", compression_level=19)' \
      "$src/$table.parquet" "$dst/$table.parquet"
  done
done
cp "$runs/sweep.json" "$out/sweep.json"
specscope compare --by-drafter "$out/draft-model" "$out/ngram" --out "$out/analysis"
