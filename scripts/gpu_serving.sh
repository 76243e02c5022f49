#!/usr/bin/env bash
# On the GPU machine: Ferry up with serve_config.gpu.yaml (HAProxy ingress), classify
# chelsea, 30 s of 64 closed-loop clients; then the alloc and conv benchmarks. Logs in $OUT.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-}
. "$(dirname "$0")/procs.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import skimage.data as d, simplejpeg; open('/tmp/chelsea.jpg','wb').write(simplejpeg.encode_jpeg(d.chelsea(), quality=90))"
start_serve() { RAY_SERVE_ENABLE_HA_PROXY=$1 setsid serve run serve_config.gpu.yaml > "$OUT/serve_ha$1.log" 2>&1 & echo $! > /tmp/serve.pid; }
wait_ready() { for _ in $(seq 1 "$1"); do curl -sf -m 2 127.0.0.1:8000/v2/health/ready > /dev/null && return 0; sleep 2; done; return 1; }
stop_serve() { kill -INT -"$(cat /tmp/serve.pid)" 2>/dev/null; sleep 8; clean; }
HA=1; start_serve 1
if ! wait_ready 100; then
  echo "HAProxy mode did not become ready; trying the default proxy"; tail -30 "$OUT/serve_ha1.log"
  stop_serve; HA=0; start_serve 0
  wait_ready 100 || { echo "serve did not come up"; tail -60 "$OUT/serve_ha0.log"; }
fi
echo "HAProxy ingress: $HA"
URL=http://127.0.0.1:8000/v1/models/resnet50/classify
curl -s -m 30 -X POST --data-binary @/tmp/chelsea.jpg -H 'Content-Type: image/jpeg' "$URL?top_k=3"; echo
for i in 1 2 3 4 5; do curl -s -m 30 -X POST --data-binary @/tmp/chelsea.jpg -H 'Content-Type: image/jpeg' "$URL?top_k=1" > "$OUT/one_client.json"; done
cat "$OUT/one_client.json"; echo
timeout 120 python3 benchmarks/loadgen.py --url "$URL" --image /tmp/chelsea.jpg --clients 64 --seconds 30 --warmup 5 | tee "$OUT/serve_check_64.json"
curl -s -m 30 -X POST --data-binary @/tmp/chelsea.jpg -H 'Content-Type: image/jpeg' "$URL?top_k=1"; echo
timeout 90 python3 benchmarks/loadgen.py --url "$URL" --image /tmp/chelsea.jpg --clients 256 --seconds 15 --warmup 3 | tee "$OUT/serve_check_256.json"
stop_serve
timeout 70 python3 benchmarks/bench_alloc.py --out "$OUT/alloc.json" --seconds 1.5 2>&1 | tail -9
timeout 150 python3 benchmarks/bench_conv.py --out "$OUT/conv.json" 2>&1 | tail -3
