#!/usr/bin/env bash
# Every planner rejection through the real client (see rejections_test.py for the cases): one
# coordinator and two jobs on loopback, "rejdp" (dp=2: DDP replicas and FSDP shards) and
# "rejpp" (pp=2: pipeline stages), then rejections_test.py, which drives long-lived Python
# trainer ranks and rejection_client against them. Exits with the Python test's status (and
# non-zero if the cluster fails to start or stop).
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=3000
trap stop_all EXIT
start_coordinator || fail "coordinator"
# start_agents replaces AGENT_PIDS: collect every job's agents so stop_agents stops them all.
all_agents=()
for job_layout in rejdp:dp=2 rejpp:pp=2; do
  start_agents "${job_layout%%:*}" "${job_layout#*:}"
  rc=$?
  all_agents+=("${AGENT_PIDS[@]}")
  AGENT_PIDS=("${all_agents[@]}")
  [ "$rc" -eq 0 ] || fail "agents of $job_layout"
done

export REJ_SOCK_DIR=$SOCK_DIR REJ_DIR=$DIR REJ_CLIENT=$PWD/tests/rejections/rejection_client
./client/python/run_python_test.sh tests/rejections/rejections_test.py "$@"
rc=$?
if [ "$rc" -ne 0 ]; then
  tail -n 30 "$DIR"/logs/*.log 2>/dev/null
fi
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
exit "$rc"
