#!/usr/bin/env bash
# On the GPU machine: bench_e2e.py for the systems given ($1, comma-separated), on a copy of
# benchmarks/results/e2e.json -- $OUT/e2e.json, whose new rows carry this run's label, so it is
# the file to commit as it comes back (and $OUT/e2e.png its plot) -- with the run's log in
# $OUT/e2e_log.txt (its tail printed), each process's GPU memory every 15 s in
# $OUT/gpu_procs.txt, the host's mean core clock and load every 15 s in $OUT/cpu_clock.txt,
# and the serve logs in $OUT/logs, with each system's replicas' WARNING and ERROR lines
# beside them (replicas_<system>.log). Everything is bounded
# by BUDGET_S (default 500 s: the device tool's calls end at 600): a system that no longer fits
# is not started, a start-up waits no longer than the budget has left, and past it by 40 s the
# run is sent SIGTERM (it stops the system under test, as a level's end does) and 20 s later
# killed, whatever runs long: at most BUDGET_S + 60 s, with the set-up and clean-up inside 600.
#   FERRY_COMMIT=<commit> bash scripts/gpu_e2e.sh ferry_hw,ferry_hw60,ferry
#   CLIENTS=256,1024 CORPUS=photos SECONDS_PER_LEVEL=6 BUDGET_S=300 bash scripts/gpu_e2e.sh ferry
# SPY=256: py-spy on two replicas of each system over the 256-client levels ($OUT/spy.tgz, its
# summary $OUT/spy_top.txt); SPY_NATIVE=1 adds the C/C++ frames (that level's figures then
# include py-spy's pauses). A spied level's row says so ("spy": "sampled" or "native").
# IDLE_SPIN=1: a nice-19 busy loop on every core for the call (no vCPU halts; a diagnostic of
# Ferry's slow mode, benchmarks/results/e2e_notes.md 2026-12-07), said in $OUT/cpu_clock.txt.
# MPS=1: every system as a client of one CUDA MPS server (rows named system+mps, each with the
# servers MPS listed once the system was up; its logs in $OUT/mps_log).
# SETS="preprocess.decode_rounds=3 ...": bench_e2e's --set for every Ferry system of the run
# (its rows named system[key=value,...]).
# CORPUS: the workload's own by default; WORKLOAD=image measures the image workload (its systems:
# ferry_image, rayserve_image_N; the U-Net compiles in each replica: minutes of start-up).
set -u
SYSTEMS=${1:?"usage: bash scripts/gpu_e2e.sh SYSTEM[,SYSTEM...]"}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/logs"
if [ -n "${SPY:-}" ] && ! command -v py-spy >/dev/null; then  # (2026-12-07: a run without it)
  echo "SPY=$SPY asks for py-spy, which is not here: bash scripts/make_devwhl.sh adds it" >&2
  exit 2
fi
export MPS_LOG_DIR="$OUT/mps_log"  # (used only under MPS=1)
BUDGET=${BUDGET_S:-500}
nproc; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -m loadtest.corpus >/dev/null
cp benchmarks/results/e2e.json "$OUT/e2e.json"
# each process's device memory every 15 s ($OUT/gpu_procs.txt): which replicas hold their
# graphs (a torch replica still compiling holds about 1 GB; 2026-12-06), whatever NVML's
# Python binding reads for the rows
( while sleep 15; do date +%T; nvidia-smi --query-compute-apps=pid,used_memory \
    --format=csv,noheader; done ) > "$OUT/gpu_procs.txt" 2>&1 &
SMI=$!
# the host's cores (sockets, NUMA nodes, threads a core) once, then every 15 s their mean
# clock (MHz) and the load average: on 2026-12-07 the same Ferry cost 1.6 then 3.3 ms of
# CPU an image in two calls on one machine while the peer's stayed -- a slower or shared
# core shows here ($OUT/cpu_clock.txt), and the host's CPU taken by the hypervisor
# (steal: cumulative jiffies of all cores, from /proc/stat, beside user and system)
( lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA node|CPU\(s\)|CPU max MHz)"
  # how an idle vCPU waits (a halted one costs the hypervisor an exit to wake: every hand-off
  # between threads pays it where cores idle) -- the kernel's idle driver and governor
  echo "cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none) /" \
    "$(cat /sys/devices/system/cpu/cpuidle/current_governor_ro /sys/devices/system/cpu/cpuidle/current_governor 2>/dev/null | head -1)" \
    "cmdline: $(tr ' ' '\n' < /proc/cmdline | grep -E '^(idle|nohz|isolcpus|intel_idle)' | tr '\n' ' ')"
  # and the machine's six busiest processes over half a second, whoever runs them (a process
  # outside the run -- a compile worker left behind, a daemon -- is in no row's CPU)
  while sleep 15; do echo "$(date +%T) $(awk '/MHz/ {s += $4; n++} END {if (n) printf "%.0f MHz mean of %d", s / n, n}' /proc/cpuinfo) load $(cut -d' ' -f1-3 /proc/loadavg) $(awk '/^cpu / {print "steal", $9, "user", $2, "sys", $4}' /proc/stat)"
    top -b -n 2 -d 0.5 -w 150 -o %CPU 2>/dev/null | awk '/^top -/ {n++} n == 2' | sed -n '8,13p'; done ) > "$OUT/cpu_clock.txt" 2>&1 &
CLOCK=$!
# IDLE_SPIN=1: a busy loop at nice 19 on every core for the whole call, so that no vCPU
# halts while the systems run (a diagnostic: their figures then include what the loops take,
# about 1/70 of a core each under CFS where work is waiting)
SPINS=""
if [ "${IDLE_SPIN:-0}" = 1 ]; then
  for _ in $(seq "$(nproc)"); do nice -n 19 bash -c 'while :; do :; done' & SPINS="$SPINS $!"; done
  echo "IDLE_SPIN: $(nproc) busy loops at nice 19 for the whole call" | tee -a "$OUT/cpu_clock.txt"
fi
timeout -k 20 $((BUDGET + 40)) python3 benchmarks/bench_e2e.py --workload "${WORKLOAD:-classify}" \
  --systems "$SYSTEMS" --budget-s "$BUDGET" --clients "${CLIENTS:-64,256,1024}" \
  --seconds "${SECONDS_PER_LEVEL:-6}" --warmup 2 ${CORPUS:+--corpus "$CORPUS"} \
  $(for s in ${SETS:-}; do echo --set "$s"; done) $([ "${MPS:-0}" = 1 ] && echo --mps) ${SPY:+--spy "$OUT/spy" --spy-clients "$SPY"} $([ "${SPY_NATIVE:-0}" = 1 ] && echo --spy-native) \
  --out "$OUT/e2e.json" --log-dir "$OUT/logs" > "$OUT/e2e_log.txt" 2>&1
kill "$SMI" "$CLOCK" $SPINS 2>/dev/null
grep -v "^\s*$" "$OUT/e2e_log.txt" | tail -40
if [ -d "$OUT/spy" ]; then  # the stacks as one file, and their summary
  python3 scripts/spy_top.py "$OUT/spy" --top 30 --match ServeReplica > "$OUT/spy_top.txt" 2>&1
  tar czf "$OUT/spy.tgz" -C "$OUT" spy && rm -rf "$OUT/spy"
fi
clean
