#!/usr/bin/env bash
# On the GPU machine: the image workload's measurement (issue 33; bench_e2e.py --workload
# image) of the systems given ($1, comma-separated; default both), at 1-1,024 clients on the
# frames720 corpus, merged into a copy of the tree's benchmarks/results/e2e.json:
# $OUT/e2e.json and $OUT/e2e.png, the serve logs in $OUT/logs. One system fits the device
# tool's 10-minute call (start-up, the U-Net compiled in each replica, then 6 levels of 15 s),
# so there run it once a system, copying $OUT/e2e.json over benchmarks/results/e2e.json
# between the calls (the next call's tree carries it, and its rows are kept):
#   FERRY_COMMIT=<commit> bash scripts/gpu_e2e_image.sh ferry_image
#   FERRY_COMMIT=<commit> bash scripts/gpu_e2e_image.sh rayserve_image_8
# CLIENTS and SECONDS_PER_LEVEL change the levels and their length (cut at 530 s, leaving the
# call time to stop the system; the levels measured by then are kept). Set FERRY_COMMIT where the
# tree has no .git: each run's note names it.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/logs"
cp benchmarks/results/e2e.json "$OUT/e2e.json"
nproc; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 530 python3 benchmarks/bench_e2e.py --workload image --systems "${1:-ferry_image,rayserve_image_8}" \
  --clients "${CLIENTS:-1,16,64,256,512,1024}" --seconds "${SECONDS_PER_LEVEL:-15}" \
  --out "$OUT/e2e.json" --log-dir "$OUT/logs" 2>&1 | grep -v "^\s*$" | tail -80
clean
