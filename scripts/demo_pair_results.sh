#!/usr/bin/env bash
# The demo pair's study, as shipped in results/demo-pair/: the paper protocol (50 prompts per
# domain, 64 tokens, paper tree, the "task" rendering) and a deeper tree for the acceptance vector
# (the top-1 spine with 3 siblings at each of 6 depths, 30 prompts per domain), both on the int8
# demo pair in batches of 8, then the analyses, the comparison of their tree shapes, the
# certificates and every record. Resumable: run it again after an interruption. About an hour on
# 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/demo-pair
spine=$(python -c 'print([(0,) * d + (r,) for d in range(6) for r in range(3)])')

specscope run --config demo --int8 --batch-size 8 --out runs/demo-full
specscope run --config demo --int8 --batch-size 8 --per-domain 30 --policy static \
  --paths "$spine" --out runs/demo-deep

mkdir -p "$out/paper-protocol" "$out/deep-tree"
specscope analyze runs/demo-full --out "$out/paper-protocol/analysis" --show none --predictors
specscope certify runs/demo-full --out "$out/paper-protocol/certify" > "$out/paper-protocol/certify-summary.txt"
rm -f "$out/paper-protocol/certify/certificates_vs_margin.svg"  # a 17 MB scatter: the PNG is kept
# Every record is shipped: the manifest and the prompt records as written, the step and node
# records re-encoded with zstd (same columns, same types, same values: load_run reads them as is).
for run in demo-full:paper-protocol demo-deep:deep-tree; do
  src=runs/${run%%:*} dst=$out/${run##*:}
  cp "$src/manifest.json" "$src/prompts.parquet" "$dst/"
  for table in steps nodes; do
    python -c 'import sys, pyarrow.parquet as pq
pq.write_table(pq.read_table(sys.argv[1]), sys.argv[2], compression="zstd", compression_level=19)' \
      "$src/$table.parquet" "$dst/$table.parquet"
    echo "$dst/$table.parquet: $(stat -c %s "$dst/$table.parquet") bytes"
  done
done
# analysed from the shipped files, as docs/results.md shows the commands
specscope analyze "$out/deep-tree" --out "$out/deep-tree/analysis" --show none --predictors
specscope compare "$out/paper-protocol" "$out/deep-tree" --shapes --out "$out/shapes" > /dev/null
