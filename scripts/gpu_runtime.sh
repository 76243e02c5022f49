#!/usr/bin/env bash
# On the GPU machine: runtime GPU tests and the three runtime benchmarks; full logs in $OUT.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/runtime.log"
nvidia-smi -L | tee "$LOG"
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'numpy', numpy.__version__)" | tee -a "$LOG"
timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" --timeout 150 -rA -s > "$OUT/gpu_tests.txt" 2>&1
grep -E "relative error|accuracy|50 threads|graph vs|passed|failed|Error" "$OUT/gpu_tests.txt" | tail -25
timeout 70 python3 benchmarks/bench_alloc.py --out "$OUT/alloc.json" --seconds 1.5 >> "$LOG" 2>&1; tail -9 "$LOG"
timeout 120 python3 benchmarks/bench_conv.py --out "$OUT/conv.json" >> "$LOG" 2>&1; tail -3 "$LOG"
timeout 150 python3 benchmarks/bench_engine.py --out "$OUT/engine.json" --seconds 1.5 >> "$LOG" 2>&1; tail -9 "$LOG"
