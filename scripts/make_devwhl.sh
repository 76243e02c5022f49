#!/usr/bin/env bash
# Here, before a session's device calls: the device bundle (.devwhl) that Ferry's GPU scripts
# need, and a check that it travels. The shared bundler (../shared/device/make-bundle.sh) with
# what Ferry adds to it: tritonclient and python-rapidjson (the gRPC service imports
# tritonclient's stubs: without them deployments.app does not import and every Ferry system of
# gpu_e2e.sh stops at once, as on 2026-12-07), py-spy (SPY=256 of gpu_e2e.sh: without it no
# level was sampled, 2026-12-07), nvImageCodec (GPU_DECODE=1), and no locust
# (NO_LOCUST=1: with its wheels the tree is over the device's 64 MiB). Then the tree and the
# bundle together must be under 64 MiB, or it says by how much and exits 1.
#   bash scripts/make_devwhl.sh            # from the project root; about 55 MB, 2-3 minutes
#   EXTRA="nvidia-cudnn-frontend" bash scripts/make_devwhl.sh   # more packages
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .devwhl
NO_LOCUST=1 GPU_DECODE=1 EXTRA="tritonclient python-rapidjson py-spy ${EXTRA:-}" \
  bash ../shared/device/make-bundle.sh
tree=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb | tail -1 | cut -f1)
whl=$(du -sb .devwhl | cut -f1)
limit=$((64 << 20))
echo "the tree ($tree bytes) and .devwhl ($whl) travel as $((tree + whl)) bytes of $limit"
if [ $((tree + whl)) -gt "$limit" ]; then
  echo "over the device's 64 MiB by $((tree + whl - limit)) bytes" >&2
  exit 1
fi
