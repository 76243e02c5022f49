#!/usr/bin/env bash
# The whole GPU verification in three calls of under 10 minutes each on the GPU machine:
# every test under tests/gpu (the slow 13-model test in the second call), a smoke
# run of each GPU benchmark (a few seconds a system: it checks that the benchmark runs, not its
# figures), and the image workload's smoke and tests (the third call). Each call writes
# $OUT/gpu_check_<part>.txt: the commit and one line a test or benchmark, PASSED / FAILED /
# SKIPPED / ERROR / TIMEOUT; its logs as one archive beside it (gpu_check_<part>_logs.tgz).
#
#   bash scripts/gpu_check.sh 1   # tests/gpu but the 13-model test | the smoke runs of the
#                                 #   benchmarks without a Serve app (seconds each: the tests
#                                 #   keep the cores; beside the 13-model test's compiles they
#                                 #   ran past 540 s on 2026-12-04)
#   bash scripts/gpu_check.sh 2   # the smoke runs of those with one | the 13-model test, both
#                                 #   halves  (| : two lanes at once, as the GPU holds both)
#   bash scripts/gpu_check.sh 3   # the image workload (issue 33): bench_e2e --workload image's
#                                 #   smoke, ferry_image and rayserve_image_8, answers checked
#                                 #   (--strict) | its peer's GPU test and its CPU tests
#   bash scripts/gpu_check.sh collect DIR [DIR ...] > benchmarks/results/gpu_tests.txt
#
# On the device tool: make the bundle (GPU_DECODE=1), carry .devwhl, set FERRY_COMMIT (its
# tree has no .git): source .devwhl/activate.sh && FERRY_COMMIT=$(...) bash scripts/gpu_check.sh 1
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}
PART=${1:-1}

if [ "$PART" = collect ]; then  # the parts' files as one gpu_tests.txt, on stdout
  shift
  echo "# scripts/gpu_check.sh on the GPU machine, both calls; one line a test or benchmark smoke."
  for d in "$@"; do cat "$d"/gpu_check_*.txt; echo; done
  exit 0
fi

mkdir -p "$OUT/logs"
RESULT="$OUT/gpu_check_$PART.txt"
COMMIT=${FERRY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
{
  echo "## part $PART: commit $COMMIT, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $(nproc) cores"
  python3 -c "import torch, cupy; print('# torch', torch.__version__, '| cupy', cupy.__version__)" 2>/dev/null
} > "$RESULT"
T0=$(date +%s)

# pytest with one result line a test, the lines kept in $RESULT: -v prints each test's line as
# it ends, so a run cut by its limit still says which tests finished and how
tests() {  # tests LIMIT_S LOG ARGS...
  local limit=$1 log="$OUT/logs/$2"; shift 2
  timeout "$limit" python3 -m pytest -v -p no:cacheprovider -o addopts= --timeout 280 -rfE \
    --durations=12 "$@" > "$log" 2>&1
  local rc=$?
  grep -E "^[^ ]+::[^ ]+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)" "$log" \
    | sed -E 's/^([^ ]+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS).*/\2 \1/' | cut -c1-240 >> "$RESULT"
  [ $rc = 124 ] && echo "TIMEOUT pytest $* (after ${limit} s; the tests above it finished)" \
    "running: $(grep -E '::' "$log" | tail -1 | cut -c1-160)" >> "$RESULT"
  grep -E "^(FAILED|ERROR) " "$log" | cut -c1-300 | sed 's/^/#   /' >> "$RESULT"
  grep -E "^FAILED: the test run left" "$log" >> "$RESULT"  # the suite's orphan check
  grep -E "[0-9]+ (passed|failed|error)" "$log" | tail -1 | sed 's/^/# /' >> "$RESULT"
  clean
}

# one benchmark's smoke run: it must exit 0 within its limit; its output goes to $OUT/smoke
smoke() {  # smoke NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  local log="$OUT/logs/bench_$name.log" t=$(date +%s)
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$? verdict=PASSED
  [ $rc = 124 ] && verdict=TIMEOUT
  [ $rc != 0 ] && [ $rc != 124 ] && verdict="FAILED (exit $rc)"
  echo "$verdict benchmarks/$name (smoke, $(( $(date +%s) - t )) s): $*" | cut -c1-240 >> "$RESULT"
  [ "$verdict" = PASSED ] || tail -5 "$log" | sed 's/^/#   /' >> "$RESULT"
  clean
}

ZOO=tests/gpu/test_torch_engine_gpu.py::test_thirteen_torchvision_models_over_http_agree_with_torch_fp32
SMOKE="$OUT/smoke"; mkdir -p "$SMOKE"
python3 -m loadtest.corpus > /dev/null 2>&1  # bench_e2e's and overload's photos

# Two lanes at once: the 13-model test (its own Ray and port 8124, CPU-bound compiles) beside
# the rest. Each lane has its own run id -- its `clean` ends only what it started -- and
# its own result file, joined into $RESULT at the end.
lane() {  # lane NAME FUNCTION
  ( FERRY_RUN_ID="$FERRY_RUN_ID.$1"; RESULT="$OUT/lane_$1.txt"; : > "$RESULT"; "$2" )
}
kernel_smokes() {  # the benchmarks without a Serve app: seconds each
  smoke bench_alloc.py 40 python3 benchmarks/bench_alloc.py --seconds 0.3 --threads 1,8 --out "$SMOKE/alloc.json"
  smoke bench_conv.py 60 python3 benchmarks/bench_conv.py --batches 8 --out "$SMOKE/conv.json"
  smoke bench_engine.py 60 python3 benchmarks/bench_engine.py --seconds 0.3 --batches 1,8 --out "$SMOKE/engine.json"
  smoke bench_decode.py 60 python3 benchmarks/bench_decode.py --seconds 0.3 --batch 8 --threads 1 --out "$SMOKE/decode.json"
  smoke bench_onnx.py 90 python3 benchmarks/bench_onnx.py --seconds 0.3 --batches 8 --out "$SMOKE/onnx.json"
  smoke bench_models.py 120 python3 benchmarks/bench_models.py --models resnet18 --batches 8 --seconds 0.3 --jobs 1 --no-merge --out "$SMOKE/models.json"
  smoke profile_inference.py 120 python3 benchmarks/profile_inference.py --groups 8 --calls 4 --seconds 1 --out "$SMOKE/profile_inference.json"
}
zoo_half() { FERRY_ZOO_PART=$1/2 tests 300 "zoo_part$1.log" "$ZOO" -s; }
zoo_both() { zoo_half 1; zoo_half 2; }  # one after the other (about 160 + 100 s)
serve_smokes() {  # the benchmarks that start a Serve app on port 8000: one after the other
  export RAY_SERVE_ENABLE_HA_PROXY=1
  smoke bench_e2e.py 300 python3 benchmarks/bench_e2e.py --systems ferry,rayserve_expert_4 --corpus chelsea --clients 16 --seconds 2 --warmup 1 --out "$SMOKE/e2e.json" --log-dir "$OUT/logs"
  smoke profile_pipeline.py 120 python3 benchmarks/profile_pipeline.py --config benchmarks/configs/ferry_e2e.yaml --model resnet50 --clients 16 --seconds 2 --out "$SMOKE/profile_pipeline.json"
  smoke overload.py 150 python3 benchmarks/overload.py --config serve_config.gpu.yaml --model resnet50 --users 8 --steady-seconds 4 --pulse-seconds 8 --settle-seconds 1 --systems budget --content-type image/jpeg --no-write --out "$SMOKE/overload"
  if [ -n "${FERRY_PERF_ANALYZER:-}" ] || [ -f .pa/perf_analyzer.xz ]; then
    smoke bench_perf_analyzer.py 150 python3 benchmarks/bench_perf_analyzer.py --config serve_config.gpu.yaml --concurrency 16 --seconds 2 --out "$SMOKE/perf_analyzer.json"
  else
    echo "SKIPPED benchmarks/bench_perf_analyzer.py (no perf_analyzer binary: carry .pa from scripts/pack_perf_analyzer.sh, or set FERRY_PERF_ANALYZER)" >> "$RESULT"
  fi
  if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    smoke bench_transport.py 120 python3 benchmarks/bench_transport.py --quick --out "$SMOKE/transport.json"
  else
    echo "SKIPPED benchmarks/bench_transport.py (NCCL between two GPUs; this machine has one)" >> "$RESULT"
  fi
}
gpu_tests() { tests 540 tests_part1.log tests/gpu --deselect "$ZOO"; }
# The image workload: each system comes up as the full measurement's does (the U-Net compiled
# per batch size in each of 8 replicas: its start-up time is the line's), answers 16 clients
# for 3 s, and must answer every request with a JPEG of its frame's size (--strict: exit 1
# otherwise, naming the level and its errors)
image_smoke() {
  export RAY_SERVE_ENABLE_HA_PROXY=1
  smoke bench_e2e.py-image 500 python3 benchmarks/bench_e2e.py --workload image --systems ferry_image,rayserve_image_8 --clients 16 --seconds 3 --warmup 1 --strict --out "$SMOKE/e2e_image.json" --log-dir "$OUT/logs"
}
image_tests() {
  tests 420 tests_image.log benchmarks/tests/test_rayserve_image_gpu.py \
    benchmarks/tests/test_rayserve_image.py benchmarks/tests/test_image_workload.py
}
case "$PART" in
  1) lane a gpu_tests & lane b kernel_smokes & wait ;;
  2) lane a serve_smokes & lane b zoo_both & wait ;;
  3) lane a image_smoke & lane b image_tests & wait ;;
  *) echo "usage: $0 1|2|3|collect DIR..." >&2; exit 2 ;;
esac
cat "$OUT"/lane_a.txt "$OUT"/lane_b.txt >> "$RESULT"
echo "# part $PART took $(( $(date +%s) - T0 )) s" >> "$RESULT"
# the device tool brings back at most 8 files: the logs and smoke outputs as one archive
tar czf "$OUT/gpu_check_${PART}_logs.tgz" -C "$OUT" logs smoke && rm -rf "$OUT/logs" "$OUT/smoke" \
  "$OUT"/lane_a.txt "$OUT"/lane_b.txt
cat "$RESULT"
