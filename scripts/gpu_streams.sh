#!/usr/bin/env bash
# On the GPU machine: issue 34's live streams -- bench_streams.py with Ferry serving the image
# workload's U-Net (benchmarks/configs/ferry_e2e_image.yaml: 8 replicas, the torch engine) and
# the expert peer (rayserve_streams_8) at the same levels, one after the other: N streams of
# 640x360 JPEG frames at 30 fps, answered as JPEG. $OUT/streams.json is the file to commit as
# it comes back (benchmarks/results/streams.json: written after each level, so a run cut
# short keeps what it measured); the run's log is $OUT/streams_log.txt. BUDGET_S (default
# 500) bounds the start-ups and the levels begun; 40 s past it the run is sent SIGTERM (it
# stops the system under test) and 20 s later killed.
#   FERRY_COMMIT=<commit> bash scripts/gpu_streams.sh
#   STREAMS=16,64,256,512 SYSTEMS=ferry SECONDS_PER_LEVEL=10 BUDGET_S=400 bash scripts/gpu_streams.sh
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU, $(nproc) cores"
BUDGET=${BUDGET_S:-500}
timeout -k 20 $((BUDGET + 40)) python3 benchmarks/bench_streams.py --budget-s "$BUDGET" \
  --config benchmarks/configs/ferry_e2e_image.yaml --systems "${SYSTEMS:-ferry,rayserve_streams_8}" \
  --model unet --query "task=image&format=jpeg" --streams "${STREAMS:-64,256,512}" --fps 30 \
  --size 640x360 --procs 8 --seconds "${SECONDS_PER_LEVEL:-10}" --label "one $GPU (16 cores)" \
  --out "$OUT/streams.json" > "$OUT/streams_log.txt" 2>&1
echo "bench_streams rc=$?"
grep -v "^\s*$" "$OUT/streams_log.txt" | tail -30
clean
