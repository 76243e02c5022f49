#!/usr/bin/env bash
# Pack Triton's perf_analyzer for a machine without it, small enough to travel with the
# working tree: .pa/perf_analyzer.xz (xz -9, about 4 MB) and .pa/lib/{libcudart.so.12,
# libb64.so.0d}.xz, which it links. benchmarks/bench_perf_analyzer.py unpacks .pa/ to /tmp.
#   bash scripts/pack_perf_analyzer.sh [PA_DIR]    (default ~/.cache/perf-analyzer, as
#   ../shared/tools/get-perf-analyzer.sh installs it)
set -euo pipefail
src="${1:-$HOME/.cache/perf-analyzer}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.pa"
b64="$(ldconfig -p | awk '/libb64.so.0d/ {print $NF; exit}')"
[ -x "$src/perf_analyzer" ] || { echo "no $src/perf_analyzer (get-perf-analyzer.sh)" >&2; exit 1; }
[ -n "$b64" ] || { echo "no libb64.so.0d (apt-get install libb64-0d)" >&2; exit 1; }
rm -rf "$out"; mkdir -p "$out/lib"
xz -9 -T0 -c "$src/perf_analyzer" > "$out/perf_analyzer.xz"
xz -9 -c "$src/lib/libcudart.so.12" > "$out/lib/libcudart.so.12.xz"
xz -9 -c "$b64" > "$out/lib/libb64.so.0d.xz"
du -sh "$out"
