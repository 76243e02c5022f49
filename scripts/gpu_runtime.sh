#!/usr/bin/env bash
# On the GPU machine: runtime GPU tests and the three runtime benchmarks, results in $OUT.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'numpy', numpy.__version__)"
timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" --timeout 150 -rA -s 2>&1 | tail -60 | tee "$OUT/gpu_tests.txt"
timeout 70 python3 benchmarks/bench_alloc.py --out "$OUT/alloc.json" --seconds 1.5 2>&1 | tail -12
timeout 120 python3 benchmarks/bench_conv.py --out "$OUT/conv.json" 2>&1 | tail -45
timeout 150 python3 benchmarks/bench_engine.py --out "$OUT/engine.json" --seconds 1.5 2>&1 | tail -14
python3 scripts/dump_imagenet_labels.py > "$OUT/imagenet_classes.txt" 2>/dev/null; wc -l "$OUT/imagenet_classes.txt"
