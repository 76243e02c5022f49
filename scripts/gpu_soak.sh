#!/usr/bin/env bash
# On the GPU machine: issue 34's soak -- serve_config.gpu.yaml under CLIENTS (8) HTTP clients
# (classify on every model, v2 tensors, 2% bad requests) and STREAMS (32) live streams of
# 640x360 JPEG at 30 fps opening and closing, MINUTES (10) long, judged by benchmarks/soak.py:
# every process's RSS and the device pool flat, the p99 steady, nothing unexpected, every
# ingress replica's stream book idle at the end.
#
# A soak of 10 minutes outlives a call of 600 s. The first call starts it in a process session
# of its own (setsid: the device keeps such a process running while the machine is held) and
# follows it for WAIT_S (540 s); call again at once -- the machine stays warm only 30 s -- and
# that call follows it to its end, then brings back $OUT/reliability.json (the repository's
# with this soak under soak.gpu_streams: the file to commit), $OUT/soak/ (the samples and the
# serve log) and $OUT/soak_log.txt, and ends what is left of the soak's processes.
#   FERRY_COMMIT=<commit> bash scripts/gpu_soak.sh     # twice, back to back
#   MINUTES=4 STREAMS=16 bash scripts/gpu_soak.sh      # one call
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DIR=/tmp/ferry-gpu-soak  # (outside the tree: the next call's copy of it must not touch this)
if [ ! -f "$DIR/pid" ]; then
  . "$(dirname "$0")/procs.sh"  # a run id for everything the soak starts; Ferry must import
  rm -rf "$DIR"; mkdir -p "$DIR"
  cp benchmarks/results/reliability.json "$DIR/reliability.json"
  echo "$FERRY_RUN_ID" > "$DIR/run_id"
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  setsid python3 benchmarks/soak.py --config serve_config.gpu.yaml --minutes "${MINUTES:-10}" \
    --clients "${CLIENTS:-8}" --streams "${STREAMS:-32}" --stream-model resnet50 \
    --stream-fps 30 --stream-size 640x360 --name gpu_streams \
    --label "one $GPU (16 cores), commit ${FERRY_COMMIT:-?}" --out "$DIR/soak" \
    --write-to "$DIR/reliability.json" > "$DIR/soak.log" 2>&1 < /dev/null &
  echo $! > "$DIR/pid"
  echo "soak started (pid $(cat "$DIR/pid"), ${MINUTES:-10} minutes of load after its start-up)"
fi
PID=$(cat "$DIR/pid")
END=$(( $(date +%s) + ${WAIT_S:-540} ))
while kill -0 "$PID" 2> /dev/null && [ "$(date +%s)" -lt "$END" ]; do
  sleep 20; tail -1 "$DIR/soak.log" | cut -c1-200
done
cp "$DIR/soak.log" "$OUT/soak_log.txt"
if kill -0 "$PID" 2> /dev/null; then
  echo "the soak is still running: call this script again now"
  exit 0
fi
wait "$PID" 2> /dev/null
echo "== the soak ended"; grep -v "^\s*$" "$DIR/soak.log" | tail -25
cp -r "$DIR/soak" "$OUT/soak" 2> /dev/null
cp "$DIR/reliability.json" "$OUT/reliability.json"
python3 -m loadtest.procs stop "$(cat "$DIR/run_id")" > /dev/null
rm -rf "$DIR"
