#!/usr/bin/env bash
# On the two-GPU machine: the transport GPU tests, the transport benchmark, then every other
# GPU test; full logs in $OUT.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L; nvidia-smi topo -m | head -4
python3 -c "import cupy; from cupy.cuda import nccl; print('cupy', cupy.__version__, 'nccl', nccl.get_version())"
T="timeout ${TESTS_S:-240} python3 -m pytest -q -p no:cacheprovider -o addopts= --timeout 120 -rA -s"
$T tests/gpu/test_nccl_gpu.py tests/gpu/test_preprocess_gpu.py > "$OUT/gpu_tests_transport.txt" 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|agreement|Error" "$OUT/gpu_tests_transport.txt" | tail -30
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_S:-200} python3 benchmarks/bench_transport.py --out "$OUT/transport.json" ${BENCH_ARGS:-} > "$OUT/bench_transport.log" 2>&1
  tail -25 "$OUT/bench_transport.log"
fi
if [ "${ALL:-1}" = 1 ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts= --timeout 150 -rA tests/gpu/test_ops_gpu.py tests/gpu/test_executor_gpu.py > "$OUT/gpu_tests_runtime.txt" 2>&1
  tail -3 "$OUT/gpu_tests_runtime.txt"
fi
