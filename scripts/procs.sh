# Sourced by the GPU scripts: everything they start carries one run id (loadtest/procs.py),
# and `clean` ends, by PID, what is still alive of it -- Serve, its Ray, its HAProxy, locust --
# and nothing else on the machine (no `ray stop --force`, no `pkill`).
FERRY_RUN_ID="${FERRY_RUN_ID:+$FERRY_RUN_ID.}script-$$-$RANDOM"
export FERRY_RUN_ID
clean() { python3 -m loadtest.procs stop "$FERRY_RUN_ID" > /dev/null; sleep 1; }
