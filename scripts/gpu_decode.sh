#!/usr/bin/env bash
# On the GPU machine: the GPU decode tests, bench_decode.py, and a CPU profile of the
# GPU-decode pipeline under load; full logs in $OUT. Needs the bundle made with GPU_DECODE=1.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nproc; nvidia-smi -L
python3 -c "from nvidia import nvimgcodec as n; print('nvimgcodec', n.__version__)"
timeout ${TESTS_S:-240} python3 -m pytest -q -p no:cacheprovider -o addopts= --timeout 150 -rA -s \
  tests/gpu/test_gpu_decode.py tests/gpu/test_preprocess_gpu.py > "$OUT/gpu_tests_decode.txt" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|agreement|diff|Error" "$OUT/gpu_tests_decode.txt" | tail -40
if [ "${BENCH:-1}" = 1 ]; then
  timeout 150 python3 benchmarks/bench_decode.py --out "$OUT/decode.json" --seconds ${BENCH_SECONDS:-3} > "$OUT/bench_decode.log" 2>&1
  tail -12 "$OUT/bench_decode.log"
fi
if [ "${PROFILE:-1}" = 1 ]; then
  clean
  RAY_SERVE_ENABLE_HA_PROXY=1 timeout 200 python3 benchmarks/profile_pipeline.py \
    --config ${PROFILE_CONFIG:-benchmarks/configs/ferry_e2e.yaml} --model resnet50 \
    --clients ${PROFILE_CLIENTS:-256} --seconds 10 > "$OUT/profile_gpu_decode.json" 2> "$OUT/profile.log"
  head -c 3000 "$OUT/profile_gpu_decode.json"; tail -5 "$OUT/profile.log"
fi
