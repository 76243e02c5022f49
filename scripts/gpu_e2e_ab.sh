#!/usr/bin/env bash
# On the GPU machine: one Ferry system measured from two trees in one call, alternating --
# this tree (new) and an older one carried beside it (base) -- so that a change is judged
# against its parent on the same machine, in the same minutes (two calls of one system on
# one machine have differed by 1.5x; benchmarks/results/e2e_notes.md, 2026-12-07).
#
# Make the base tree here (ignored, so name it in the device tool's carry; its tests/ stay:
# bench_e2e imports the image workload's model from them):
#   rm -rf .snap && mkdir .snap && git archive <commit> | tar -x -C .snap \
#     && rm -rf .snap/docs .snap/benchmarks/results && mkdir -p .snap/benchmarks/results \
#     && cp benchmarks/results/e2e.json .snap/benchmarks/results/
# Then on the device (after activate.sh; what travels is the working tree, uncommitted
# changes included: commit first, so that FERRY_COMMIT names the code that ran):
#   BASE_COMMIT=<commit> FERRY_COMMIT=<commit> ORDER="base new" CLIENTS=64,256 \
#     BUDGET_S=200 bash scripts/gpu_e2e_ab.sh ferry_torch_dyn
# BUDGET_S is each step's: a system starts only where its usual start-up, a level and its
# stop fit (ferry_torch_dyn: about 180 s). Each step is scripts/gpu_e2e.sh of its tree with
# OUT=$OUT/<i>_<side> and its env (CORPUS, CLIENTS, SETS...); $OUT/ab.txt gets one line a
# level: the step, the side, clients, img/s, p99 and server CPU ms an image. The steps'
# folders are packed into $OUT/steps.tgz at the end (the device tool brings back 8 files).
set -u
SYSTEM=${1:?"usage: bash scripts/gpu_e2e_ab.sh SYSTEM"}
BASE=${BASE_DIR:-.snap}
OUT=${OUT:-/tmp/out}
ROOT=$PWD
P0=${PYTHONPATH:-}
[ -d "$BASE/pipeline" ] || { echo "no base tree in $BASE" >&2; exit 2; }
i=0
for side in ${ORDER:-base new base new}; do
  i=$((i + 1))
  dir=$ROOT commit=${FERRY_COMMIT:-new}
  if [ "$side" = base ]; then dir=$ROOT/$BASE commit=${BASE_COMMIT:-base}; fi
  (cd "$dir" && PYTHONPATH=$dir:$P0 FERRY_COMMIT=$commit OUT=$OUT/${i}_$side \
    bash scripts/gpu_e2e.sh "$SYSTEM" > "$OUT/${i}_$side.log" 2>&1)
  python3 - "$OUT/${i}_$side/e2e.json" "$i" "$side" "$SYSTEM" >> "$OUT/ab.txt" <<'EOF'
import json, sys
path, step, side, system = sys.argv[1:]
try:
    d = json.load(open(path))
    this = max(d["runs"], key=lambda k: int("".join(c for c in k if c.isdigit()) or 0))
    rows = [r for r in d["rows"] if r.get("run") == this and r["system"] == system]
except (OSError, KeyError, ValueError) as exc:
    print(step, side, "no rows:", exc)
    raise SystemExit(0)
for r in rows:
    print(step, side, r["clients"], r["img_s"], r.get("p99_ms"), r.get("server_cpu_ms_per_img"),
          r.get("run"))
EOF
done
cat "$OUT/ab.txt"
(cd "$OUT" && tar czf steps.tgz [0-9]*_* && rm -rf [0-9]*_*)
