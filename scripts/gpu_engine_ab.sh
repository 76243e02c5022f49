#!/usr/bin/env bash
# On the GPU machine: issue 29's A/B of how Ferry's executor waits for its batches
# (executor.batch_wait: sleep, the default, against spin, as torch's own loop waits), for the
# models where the trace showed the GPU running dry between Ferry's batches.
#   FERRY_COMMIT=<commit> bash scripts/gpu_engine_ab.sh
#   MODELS=squeezenet1_1,mobilenet_v2 BATCHES=1,32,128 SPY=1 bash scripts/gpu_engine_ab.sh
#   TRACE=0 MODELS=squeezenet1_1 bash scripts/gpu_engine_ab.sh    # bench_models' A/B alone
#   TRACE=0 WAITS=sleep STREAMS=3,1 bash scripts/gpu_engine_ab.sh  # one stream against three
# Per model and wait: trace_engine.py (the device's idle gaps under each loop; SPY=1 adds
# py-spy's stacks of Ferry's loop) into $OUT/trace_<model>_<wait>.json; then bench_models.py
# at each wait (WAITS) and compute-stream count (STREAMS), every system of a batch size in one
# run, into $OUT/models_<wait>[_s<streams>].json (kept
# apart from benchmarks/results/models.json: --no-merge). Each step is bounded by timeout and
# by what is left of BUDGET_S (default 540 s: the device tool's calls end at 600): a step that
# no longer fits 60 s is skipped and says so. A trace recompiles its model in each process
# (about a minute a model): with more than one model, run the traces in calls of their own.
# Run after `source .devwhl/activate.sh` (procs.sh checks that Ferry imports).
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODELS=${MODELS:-squeezenet1_1,resnet18}
BATCHES=${BATCHES:-1,32}
WAITS=${WAITS:-sleep,spin}  # executor.batch_wait of each bench_models run
STREAMS=${STREAMS:-3}  # its --compute-streams (1: the batches in flight queue on one stream)
T0=$(date +%s); BUDGET=${BUDGET_S:-540}
give() {  # give LIMIT_S -> the seconds to give a step (0: skip it)
  local left=$(( T0 + BUDGET - $(date +%s) - 15 ))
  [ "$left" -lt 60 ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}
if [ -n "${SPY:-}" ] && ! command -v py-spy > /dev/null; then
  echo "SPY is set but py-spy is not on PATH (the bundle leaves it out: add its wheel)" >&2; exit 2
fi
nvidia-smi --query-gpu=name --format=csv,noheader
for m in $([ "${TRACE:-1}" = 1 ] && echo "${MODELS//,/ }"); do
  for w in sleep spin; do
    t=$(give 200); [ "$t" = 0 ] && { echo "== trace $m $w: skipped (budget)"; continue; }
    timeout -k 10 "$t" python3 benchmarks/trace_engine.py --model "$m" --batches "$BATCHES" \
      --steps 200 --batch-wait "$w" --out "$OUT/trace_${m}_$w.json" \
      ${SPY:+--spy "$OUT/spy_${m}_$w"} > "$OUT/trace_${m}_$w.log" 2>&1
    echo "== trace $m $w (rc $?)"; grep '^{' "$OUT/trace_${m}_$w.log" | cut -c1-240
  done
done
for s in ${STREAMS//,/ }; do
  for w in ${WAITS//,/ }; do
    v=${w}$([ "$s" = 3 ] || echo "_s$s")  # (3: bench_models' default, one per batch in flight)
    t=$(give 400); [ "$t" = 0 ] && { echo "== bench_models $v: skipped (budget)"; continue; }
    timeout -k 10 "$t" python3 benchmarks/bench_models.py --models "$MODELS" --batches "$BATCHES" \
      --batch-wait "$w" --compute-streams "$s" --out "$OUT/models_$v.json" --no-merge \
      > "$OUT/models_$v.log" 2>&1
    echo "== bench_models $v (rc $?)"; grep -v "^\s*$" "$OUT/models_$v.log" | tail -14
  done
done
if [ -n "${SPY:-}" ]; then
  for d in "$OUT"/spy_*; do python3 scripts/spy_top.py "$d" --top 30 > "$d.top.txt" 2>&1; done
fi
clean
