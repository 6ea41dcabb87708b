#!/usr/bin/env bash
# The README's policy table: train a TPC-H model on the embedded DuckDB, then run
# `admission bench` for the Light, Medium and Heavy mixes with it. About 25 minutes.
# An existing OUT_DIR/model.json is reused.
#
#   bash benchmarks/policies.sh [SF] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
sf=${1:-1}
out=${2:-out/policies}
mkdir -p "$out"
bash scripts/bootstrap >/dev/null
admission=.venv/bin/admission
if [ ! -f "$out/model.json" ]; then  # remove it to train again
    $admission train --tpch "$sf" --classes 1,4,9,16,18,21 --concurrency 8 --duration 30 \
        --out "$out/model.json"
fi
for mix in light medium heavy; do
    $admission bench --tpch "$sf" --model "$out/model.json" --mix "$mix" --clients 16 \
        --duration 20 --repetitions 3 --mpl 4 --plot "$out" --save "$out/$mix.json" \
        | tee "$out/$mix.txt"
done
.venv/bin/python -m benchmarks.policies_table "$out"/light.json "$out"/medium.json "$out"/heavy.json
