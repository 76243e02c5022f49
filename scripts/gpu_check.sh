#!/usr/bin/env bash
# The whole GPU verification in two calls of under 10 minutes each on the GPU machine: every
# test under tests/gpu (the slow 13-model test split in two halves), a smoke run of each GPU
# benchmark (a few seconds a system: it checks that the benchmark runs, not its figures) and
# the image workload's smoke and tests. Each call runs three lanes at once and writes
# $OUT/gpu_check_<part>.txt: the commit and one line a test or benchmark, PASSED / FAILED /
# SKIPPED / ERROR / TIMEOUT, and how long each lane took; its logs as one archive beside it
# (gpu_check_<part>_logs.tgz). Every step's limit is cut to what is left of the part's
# PART_S (560 s; a step is killed 10 s after its limit), so a call ends in time whatever
# runs long; a step that finds no time left says so (TIMEOUT, not started).
#
#   bash scripts/gpu_check.sh 1   # tests/gpu's kernel (cupy) files | its torch files |
#                                 #   Serve lane: the shipped GPU config's test, then the
#                                 #   smoke runs of bench_e2e (ferry and the batching peer)
#                                 #   and profile_pipeline
#   bash scripts/gpu_check.sh 2   # the 13-model test, both halves, then the smoke runs of the
#                                 #   benchmarks without a Serve app | Serve lane: overload,
#                                 #   perf_analyzer, streams, the image workload's smoke |
#                                 #   the image workload's tests and the expert peer's GPU core
#   bash scripts/gpu_check.sh collect DIR [DIR ...] > benchmarks/results/gpu_tests.txt
#
# Only one lane a part starts Serve apps on ports 8000/9000 (its steps one after the other);
# the tests' own apps take ports of their own (8123, 8124, 8131, 8132).
# On the device tool: make the bundle (bash scripts/make_devwhl.sh), carry .devwhl, set
# FERRY_COMMIT (its tree has no .git):
#   source .devwhl/activate.sh && FERRY_COMMIT=$(...) bash scripts/gpu_check.sh 1
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}
PART=${1:-1}
T0=$(date +%s)
PART_S=${PART_S:-560}  # the part's steps' time: the device tool's calls end at 600 s

if [ "$PART" = collect ]; then  # the parts' files as one gpu_tests.txt, on stdout
  shift
  echo "# scripts/gpu_check.sh on the GPU machine, both calls; one line a test or benchmark smoke."
  for d in "$@"; do cat "$d"/gpu_check_*.txt; echo; done
  exit 0
fi
. "$(dirname "$0")/procs.sh"  # (after collect, which runs anywhere: it checks the app imports)

mkdir -p "$OUT/logs"
RESULT="$OUT/gpu_check_$PART.txt"
COMMIT=${FERRY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
{
  echo "## part $PART: commit $COMMIT, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $(nproc) cores"
  python3 -c "import torch, cupy; print('# torch', torch.__version__, '| cupy', cupy.__version__)" 2>/dev/null
} > "$RESULT"

# the limit a step gets: its own, or what is left of the part's PART_S if that is less
budget() {  # budget LIMIT_S -> prints the seconds to give (0: no time left)
  local left=$(( T0 + PART_S - $(date +%s) ))
  [ "$left" -lt 15 ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# pytest with one result line a test, the lines kept in $RESULT: -v prints each test's line as
# it ends, so a run cut by its limit still says which tests finished and how
tests() {  # tests LIMIT_S LOG ARGS...
  local limit log="$OUT/logs/$2" t=$(date +%s); limit=$(budget "$1"); shift 2
  if [ "$limit" = 0 ]; then
    echo "TIMEOUT pytest $* (not started: the part's ${PART_S} s were spent)" | cut -c1-240 >> "$RESULT"
    return
  fi
  timeout -k 10 "$limit" python3 -m pytest -v -p no:cacheprovider -o addopts= --timeout 280 -rfE \
    --durations=15 "$@" > "$log" 2>&1
  local rc=$?; [ $rc = 137 ] && rc=124  # (killed 10 s after its limit)
  grep -E "^[^ ]+::[^ ]+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)" "$log" \
    | sed -E 's/^([^ ]+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS).*/\2 \1/' | cut -c1-240 >> "$RESULT"
  [ $rc = 124 ] && echo "TIMEOUT pytest $* (after ${limit} s; the tests above it finished)" \
    "running: $(grep -E '::' "$log" | tail -1 | cut -c1-160)" >> "$RESULT"
  grep -E "^(FAILED|ERROR) " "$log" | cut -c1-300 | sed 's/^/#   /' >> "$RESULT"
  grep -E "^FAILED: the test run left" "$log" >> "$RESULT"  # the suite's orphan check
  grep -E "[0-9]+ (passed|failed|error)" "$log" | tail -1 | sed "s/^/# ($(( $(date +%s) - t )) s) /" >> "$RESULT"
  clean
}

# one benchmark's smoke run: it must exit 0 within its limit; its output goes to $OUT/smoke
smoke() {  # smoke NAME LIMIT_S CMD...
  local name=$1 limit log="$OUT/logs/bench_$1.log" t=$(date +%s); limit=$(budget "$2"); shift 2
  if [ "$limit" = 0 ]; then
    echo "TIMEOUT benchmarks/$name (not started: the part's ${PART_S} s were spent)" >> "$RESULT"
    return
  fi
  timeout -k 10 "$limit" "$@" > "$log" 2>&1
  local rc=$? verdict=PASSED; [ $rc = 137 ] && rc=124
  [ $rc = 124 ] && verdict=TIMEOUT
  [ $rc != 0 ] && [ $rc != 124 ] && verdict="FAILED (exit $rc)"
  echo "$verdict benchmarks/$name (smoke, $(( $(date +%s) - t )) s): $*" | cut -c1-240 >> "$RESULT"
  [ "$verdict" = PASSED ] || tail -5 "$log" | sed 's/^/#   /' >> "$RESULT"
  clean
}

# The device's memory every 5 s, and each process's, into the logs: lanes share one GPU, and
# an out-of-memory error in one lane is explained by what the others held at that time
nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu --format=csv,noheader \
  -l 5 > "$OUT/logs/gpu_memory.csv" 2>/dev/null &
MEM_PID=$!
( trap 'kill $! 2>/dev/null; exit 0' TERM  # (the sleep is waited for: TERM ends it at once)
  while sleep 10 & wait $!; do date -u +%T; nvidia-smi --query-compute-apps=pid,used_memory \
    --format=csv,noheader 2>/dev/null; done ) > "$OUT/logs/gpu_memory_by_process.log" 2>&1 &
MEM_LOOP=$!
stop_samplers() { kill "$MEM_PID" "$MEM_LOOP" 2>/dev/null; wait "$MEM_PID" "$MEM_LOOP" 2>/dev/null; }
trap stop_samplers EXIT  # also when the part is cut short or refused

ZOO=tests/gpu/test_torch_engine_gpu.py::test_thirteen_torchvision_models_over_http_agree_with_torch_fp32
SMOKE="$OUT/smoke"; mkdir -p "$SMOKE"
# The smoke runs' Ferry apps are small: two replicas and three batch sizes. Three lanes share
# one device, and the shipped form (8 replicas, each a pool of 0.113 of the device and every
# bucket to 256 warmed) holds most of an 80 GB H100 by itself: on one, on 2026-12-05, two
# lanes' cudaMalloc failed while the e2e smoke's replicas warmed up. The shipped config
# itself is tested on its own in part 1 (tests/gpu/test_shipped_gpu_config.py). The smokes
# test the scripts, not the engines: the small form's models are on the native engine (no
# torch.compile in each replica, minutes of a lane's time) and it listens on Serve's port only.
SMALL="$SMOKE/serve_config.gpu.small.yaml"
python3 - serve_config.gpu.yaml "$SMALL" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
for app in cfg["applications"]:
    c = app["args"]["config"]
    c["executor"]["buckets"] = [1, 8, 32]
    c["ingress_deployment"]["replicas_per_gpu"] = 2
    c["ingress"].pop("direct_port", None)
    c["models"] = [{"name": m["name"], "arch": m.get("arch") or m["source"]} for m in c["models"]]
yaml.safe_dump(cfg, open(sys.argv[2], "w"), sort_keys=False)
PY
[ -s "$SMALL" ] || echo "FAILED making $SMALL from serve_config.gpu.yaml: the smokes that use it fail too" >> "$RESULT"
SMALL_E2E=(--set ingress_deployment.num_replicas=2 --set "executor.buckets=[1,8,32]")
python3 -m loadtest.corpus > /dev/null 2>&1  # bench_e2e's and overload's photos

# Lanes run at once, each with its own run id -- its `clean` ends only what it started --
# and its own result file, joined into $RESULT at the end with the lane's time.
lane() {  # lane NAME FUNCTION
  ( FERRY_RUN_ID="$FERRY_RUN_ID.$1"; RESULT="$OUT/lane_$1.txt"; : > "$RESULT"; local t=$(date +%s)
    "$2"; echo "# lane $1 ($2) took $(( $(date +%s) - t )) s" >> "$RESULT" )
}
# tests/gpu in two lanes of about equal work: the files whose kernels are Ferry's own on
# cupy (with the Serve apps of their own ports), and those that compile with torch
KERNEL_TESTS="tests/gpu/test_onnx_ops_gpu.py tests/gpu/test_ops_gpu.py tests/gpu/test_task_ops_gpu.py
  tests/gpu/test_executor_gpu.py tests/gpu/test_preprocess_gpu.py tests/gpu/test_gpu_decode.py
  tests/gpu/test_onnx_gpu.py tests/gpu/test_faults_gpu.py tests/gpu/test_lease_gc_gpu.py
  tests/gpu/test_host_wait_gpu.py tests/gpu/test_nccl_gpu.py tests/gpu/test_encode_device_gpu.py
  tests/gpu/test_tasks_gpu.py"
TORCH_TESTS="tests/gpu/test_torch_engine_gpu.py tests/gpu/test_onnx_torch_gpu.py
  tests/gpu/test_onnx_transformers_gpu.py tests/gpu/test_precision_gpu.py"
SHIPPED=tests/gpu/test_shipped_gpu_config.py  # serve_config.gpu.yaml on ports 8000/8001/9000
kernel_tests() { tests 560 tests_kernels.log $KERNEL_TESTS; }
torch_tests() { tests 560 tests_torch.log $TORCH_TESTS --deselect "$ZOO"; }
all_listed() {  # every tests/gpu file is in one of the lists (a new file must not go unrun)
  local f
  for f in tests/gpu/test_*.py; do
    case " $(echo $KERNEL_TESTS $TORCH_TESTS $SHIPPED) " in
      *" $f "*) ;;
      *) echo "FAILED $f (in no lane of scripts/gpu_check.sh: add it to one)" >> "$RESULT" ;;
    esac
  done
}
kernel_smokes() {  # the benchmarks without a Serve app: seconds each
  smoke bench_alloc.py 40 python3 benchmarks/bench_alloc.py --seconds 0.3 --threads 1,8 --out "$SMOKE/alloc.json"
  smoke bench_conv.py 60 python3 benchmarks/bench_conv.py --batches 8 --out "$SMOKE/conv.json"
  smoke bench_engine.py 60 python3 benchmarks/bench_engine.py --seconds 0.3 --batches 1,8 --out "$SMOKE/engine.json"
  smoke bench_decode.py 90 python3 benchmarks/bench_decode.py --seconds 0.3 --corpus chelsea,photos --batches 8 --threads 1 --backends auto --out "$SMOKE/decode.json"
  smoke bench_onnx.py 90 python3 benchmarks/bench_onnx.py --seconds 0.3 --batches 8 --out "$SMOKE/onnx.json"
  smoke bench_models.py 120 python3 benchmarks/bench_models.py --models resnet18 --batches 8 --seconds 0.3 --jobs 1 --no-merge --out "$SMOKE/models.json"
  smoke profile_inference.py 120 python3 benchmarks/profile_inference.py --groups 8 --calls 4 --seconds 1 --out "$SMOKE/profile_inference.json"
  if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    smoke bench_transport.py 120 python3 benchmarks/bench_transport.py --quick --out "$SMOKE/transport.json"
  else
    echo "SKIPPED benchmarks/bench_transport.py (NCCL between two GPUs; this machine has one)" >> "$RESULT"
  fi
}
# (no -s: with it Ray's log lines split the test's result line, and no result is kept)
zoo_half() { FERRY_ZOO_PART=$1/2 tests 300 "zoo_part$1.log" "$ZOO"; }
# the Serve lanes: each app on ports 8000/9000, one after the other
serve_lane_1() {
  export RAY_SERVE_ENABLE_HA_PROXY=1
  # (330 s: the shipped ResNet-50 compiles with torch.compile while lane b compiles too; the
  # smoke's peer is the plain batching one, whose app starts in seconds -- the expert peer's
  # compiles took 296 s of this lane's 470 on 2026-12-06, and every e2e lease runs it whole)
  tests 330 tests_shipped.log "$SHIPPED"
  smoke bench_e2e.py 240 python3 benchmarks/bench_e2e.py --systems ferry,rayserve_batch_1rep "${SMALL_E2E[@]}" --corpus chelsea --clients 16 --seconds 2 --warmup 1 --out "$SMOKE/e2e.json" --log-dir "$OUT/logs"
  smoke profile_pipeline.py 120 python3 benchmarks/profile_pipeline.py --config benchmarks/configs/ferry_e2e.yaml --model resnet50 --clients 16 --seconds 2 --out "$SMOKE/profile_pipeline.json"
}
serve_lane_2() {
  export RAY_SERVE_ENABLE_HA_PROXY=1
  smoke overload.py 150 python3 benchmarks/overload.py --config "$SMALL" --model resnet50 --users 8 --steady-seconds 4 --pulse-seconds 8 --settle-seconds 1 --systems budget --content-type image/jpeg --no-write --out "$SMOKE/overload"
  if [ -n "${FERRY_PERF_ANALYZER:-}" ] || [ -f .pa/perf_analyzer.xz ]; then
    smoke bench_perf_analyzer.py 150 python3 benchmarks/bench_perf_analyzer.py --config "$SMALL" --protocols http,grpc,grpc_stream --concurrency 16 --seconds 2 --out "$SMOKE/perf_analyzer.json"
  else
    echo "SKIPPED benchmarks/bench_perf_analyzer.py (no perf_analyzer binary: carry .pa from scripts/pack_perf_analyzer.sh, or set FERRY_PERF_ANALYZER)" >> "$RESULT"
  fi
  # (Ferry's side only: the peer's GPU work is rayserve_image's batcher, smoke-run below,
  # and its WebSocket layer runs in tests/integration/test_streams_peer.py on the CPU)
  smoke bench_streams.py 150 python3 benchmarks/bench_streams.py --config "$SMALL" --model resnet50 --streams 4 --fps 10 --seconds 3 --size 640x360 --label "smoke" --out "$SMOKE/streams.json"
  # The image workload (issue 33): both systems come up as the full measurement's do, but with
  # two replicas and two batch sizes each (the U-Net compiles per batch size in each replica:
  # the full start-up is the full run's), answer 16 clients for 3 s, and must answer every
  # request with a JPEG of its frame's size (--strict: exit 1 otherwise, naming the level)
  smoke bench_e2e.py-image 300 python3 benchmarks/bench_e2e.py --workload image --systems ferry_image,rayserve_image_2 --set ingress_deployment.num_replicas=2 --set "executor.buckets=[1,16]" --clients 16 --seconds 3 --warmup 1 --strict --out "$SMOKE/e2e_image.json" --log-dir "$OUT/logs"
}
zoo_then_kernel_smokes() { zoo_half 1; zoo_half 2; kernel_smokes; }
image_tests() {
  tests 420 tests_image.log benchmarks/tests/test_rayserve_image_gpu.py \
    benchmarks/tests/test_rayserve_image.py benchmarks/tests/test_image_workload.py \
    benchmarks/tests/test_rayserve_expert_gpu.py  # (and the expert peer's GPU core)
}
# (each lane's pid waited for: a bare `wait` would also wait for the memory samplers)
case "$PART" in
  1) all_listed; lane a kernel_tests & A=$!; lane b torch_tests & B=$!; lane c serve_lane_1 & C=$!
     wait $A $B $C ;;
  2) lane a zoo_then_kernel_smokes & A=$!; lane b serve_lane_2 & B=$!; lane c image_tests & C=$!
     wait $A $B $C ;;
  *) echo "usage: $0 1|2|collect DIR..." >&2; exit 2 ;;
esac
cat "$OUT"/lane_a.txt "$OUT"/lane_b.txt "$OUT"/lane_c.txt >> "$RESULT"
stop_samplers
sort -t, -k2 -n "$OUT/logs/gpu_memory.csv" 2>/dev/null | tail -1 | sed 's/^/# the most device memory in use (every 5 s): /' >> "$RESULT"
echo "# part $PART took $(( $(date +%s) - T0 )) s" >> "$RESULT"
# the device tool brings back at most 8 files: the logs and smoke outputs as one archive
tar czf "$OUT/gpu_check_${PART}_logs.tgz" -C "$OUT" logs smoke && rm -rf "$OUT/logs" "$OUT/smoke" \
  "$OUT"/lane_a.txt "$OUT"/lane_b.txt "$OUT"/lane_c.txt
cat "$RESULT"
