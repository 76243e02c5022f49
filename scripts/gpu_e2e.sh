#!/usr/bin/env bash
# On the GPU machine: bench_e2e.py for the systems given ($1, comma-separated), results in $OUT/e2e_$2.json.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nproc; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 590 python3 benchmarks/bench_e2e.py --systems "$1" --clients ${CLIENTS:-1,16,64,256,512,1024} --seconds ${SECONDS_PER_LEVEL:-15} --corpus ${CORPUS:-chelsea,photos} \
  --out "$OUT/e2e_$2.json" --log-dir "$OUT" 2>&1 | grep -v "^\s*$" | tail -40
