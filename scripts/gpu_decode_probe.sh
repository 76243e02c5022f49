#!/usr/bin/env bash
# On the GPU machine, one device call (under 10 minutes): why nvImageCodec's host cost per
# image is 3-14x its one-process figure when Ferry's 8 replicas share the GPU (e2e_notes.md).
# bench_decode.py with each GPU backend in 1 process and in 8 at once, the 8 with CUDA's
# default host waits and with sleeping ones; then the same under a CUDA MPS server. Writes
# $OUT/decode_procs.json and $OUT/decode_procs_mps.json (the logs beside them).
#   FERRY_COMMIT=<commit> bash scripts/gpu_decode_probe.sh
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ARGS="--seconds ${SECONDS_PER_ROW:-2} --corpus chelsea,photos --batches ${BATCHES:-64}
  --threads 4 --backends ${BACKENDS:-auto,hardware} --procs 1,8 --host-wait auto,sleep --no-peer"
python3 -m loadtest.corpus >/dev/null
# shellcheck disable=SC2086
timeout "${PART_S:-250}" python3 benchmarks/bench_decode.py $ARGS --out "$OUT/decode_procs.json" \
  > "$OUT/decode_procs_log.txt" 2>&1
tail -12 "$OUT/decode_procs_log.txt"
# shellcheck disable=SC2086
timeout "${PART_S:-250}" python3 benchmarks/bench_decode.py $ARGS --mps \
  --out "$OUT/decode_procs_mps.json" > "$OUT/decode_procs_mps_log.txt" 2>&1
tail -12 "$OUT/decode_procs_mps_log.txt"
