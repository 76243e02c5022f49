#!/usr/bin/env bash
# On the GPU machine: the overload pulse of benchmarks/configs/overload_gpu.yaml, as recorded
# in benchmarks/results/reliability.json (overload_gpu). Exports ResNet-50 at 768x768, builds
# the loadtest corpus, and runs benchmarks/overload.py with 8 locust processes and JPEG input.
#   MPS=1     run the 8 replicas as clients of one CUDA MPS server (started here, quit at the end)
#   SYSTEMS   which systems overload.py runs, comma-separated (default budget,no_budget)
#   WRITE=1   write the result into reliability.json's overload_gpu (its runs so far become repeats;
#             set FERRY_COMMIT, the tree there has no .git); default --no-write
# Output (overload.json; a folder a system with its events and serve log, gzipped) goes to
# $OUT/overload.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
export RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/overload"
SYSTEMS=${SYSTEMS:-budget,no_budget}
python3 -c "import deployments.app, orjson, simplejpeg" || {
  echo "the app does not import: make the bundle with EXTRA='orjson swagger-ui-bundle-v2'"; exit 2; }
CONDITIONS="one H200 machine (16 cores); locust on the same machine"
if [ "${MPS:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "MPS did not start"; exit 2; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  CONDITIONS="$CONDITIONS; CUDA MPS on (nvidia-cuda-mps-control -d before serve run; the 8 replicas are MPS clients)"
fi
python3 -m loadtest.corpus > /dev/null
python3 benchmarks/export_onnx.py --out /tmp/ferry-heavy/resnet50_768.onnx | tail -1
WRITE_FLAG=--no-write; [ "${WRITE:-0}" = 1 ] && WRITE_FLAG="--section overload_gpu"
# shellcheck disable=SC2086  # WRITE_FLAG is one word or two
python3 benchmarks/overload.py --config benchmarks/configs/overload_gpu.yaml \
  --model resnet50_768 --users 64 --steady-seconds 30 --pulse-seconds 90 --processes 8 \
  --content-type image/jpeg --systems "$SYSTEMS" --conditions "$CONDITIONS" $WRITE_FLAG \
  --out "$OUT/overload"
clean
echo "segfaults in the serve logs: $(cat "$OUT"/overload/*/serve.log 2>/dev/null | grep -ci segfault)"
gzip -f "$OUT"/overload/*/*.csv "$OUT"/overload/*/serve.log 2>/dev/null
