# Sourced by the GPU scripts: everything they start carries one run id (loadtest/procs.py),
# and `clean` ends, by PID, what is still alive of it -- Serve, its Ray, its HAProxy, locust --
# and nothing else on the machine (no `ray stop --force`, no `pkill`).
FERRY_RUN_ID="${FERRY_RUN_ID:+$FERRY_RUN_ID.}script-$$-$RANDOM"
export FERRY_RUN_ID
clean() { python3 -m loadtest.procs stop "$FERRY_RUN_ID" > /dev/null; sleep 1; }
# Before anything starts: Ferry's app must import here. A package the device bundle lacks
# (tritonclient, for the gRPC service) otherwise shows only as every Ferry system's
# DEPLOY_FAILED after its start-up wait. The bundle that has it and fits the device's 64 MiB
# beside the tree: `bash scripts/make_devwhl.sh` (55 MB, 2026-12-07).
if ! _err=$(python3 -c "import deployments.app" 2>&1); then
  echo "deployments.app does not import on this machine: $(echo "$_err" | tail -1)" >&2
  exit 2
fi
