#!/usr/bin/env bash
# On the GPU machine: every tests/gpu test this machine can run, a CPU + py-spy profile of a
# pipeline under load, and bench_e2e.py for the systems in $SYSTEMS; everything under $OUT.
#   TESTS=0 SPY=1 SPY_GIL=1 SYSTEMS=ferry,ferry_split PROFILE_CONFIG=... PROFILE_CLIENTS=256 bash scripts/gpu_diag.sh
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nproc; nvidia-smi -L
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TESTS_S:-200} python3 -m pytest -q -p no:cacheprovider -o addopts= --timeout 150 -rA \
    tests/gpu > "$OUT/gpu_tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.txt" | tail -15
fi
if [ "${PROFILE:-1}" = 1 ]; then
  clean
  spy=; [ "${SPY:-1}" = 1 ] && spy="--spy $OUT/spy"
  [ -n "$spy" ] && [ "${SPY_GIL:-0}" = 1 ] && spy="$spy --spy-gil"  # only the GIL holder
  RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=${THROUGHPUT:-1} \
    timeout 200 python3 benchmarks/profile_pipeline.py \
    --config ${PROFILE_CONFIG:-benchmarks/configs/ferry_e2e.yaml} --model resnet50 \
    --clients ${PROFILE_CLIENTS:-256} --seconds 10 $spy --out "$OUT/profile_gpu.json" \
    --label "${PROFILE_LABEL:-gpu}" > "$OUT/profile.log" 2>&1
  python3 - "$OUT/profile_gpu.json" <<'PY'
import json, sys
r = list(json.load(open(sys.argv[1]))["results"].values())[-1]
print("load", {k: r["load"][k] for k in ("clients", "img_s", "p50_ms", "p99_ms", "errors")},
      "busy cores", r.get("machine_busy_cores"))
print("cpu ms/request", r["cpu_ms_per_request"])
for kind, threads in r.get("cpu_ms_per_request_by_thread", {}).items():
    print("  by thread", kind, threads)
PY
  [ -n "$spy" ] && python3 scripts/spy_top.py "$OUT/spy" --top 12 --match ServeReplica | head -60
fi
if [ -n "${SYSTEMS:-}" ]; then
  clean
  timeout ${E2E_S:-400} python3 benchmarks/bench_e2e.py --systems "$SYSTEMS" --clients 1,16,64,256,512 \
    --seconds ${SECONDS_PER_LEVEL:-20} --out "$OUT/e2e_${TAG:-diag}.json" --log-dir "$OUT" 2>&1 \
    | grep --line-buffered -v "^\s*$"  # as it goes: a run cut short still shows its levels
fi
