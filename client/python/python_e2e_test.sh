#!/usr/bin/env bash
# End-to-end test of the Python module with real processes on loopback: a coordinator, two
# agents each of jobs "pydp" and "pyabs" (layout dp=2), "pypp" and "pymem" (pp=2), then
# tessera_e2e_test.py, which runs Python trainer processes against them. Exits with the
# Python test's status (and non-zero if the cluster fails to start or stop).
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=3000
trap stop_all EXIT
start_coordinator || fail "coordinator"
start_jobs pydp:dp=2 pyabs:dp=2 pypp:pp=2 pymem:pp=2 || fail "agents"

export TESSERA_E2E_SOCK_DIR=$SOCK_DIR TESSERA_E2E_DIR=$DIR
./client/python/run_python_test.sh client/python/tessera_e2e_test.py
rc=$?
if [ "$rc" -ne 0 ]; then
  tail -n 20 "$DIR"/logs/*.log 2>/dev/null
fi
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
exit "$rc"
