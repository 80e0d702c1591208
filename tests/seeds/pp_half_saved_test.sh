#!/usr/bin/env bash
# Seed scenario pp_half_saved, side by side: torchtitan's report replayed with torch 2.11 —
# two pipeline stages (torch.distributed.pipelining over gloo) whose blocks are both named
# layers.0 and layers.1 — saved with DCP and with tessera (pp_side_by_side_rank.py has the
# details), each also with stage-unique names as a control. This script runs the two stage
# processes against a coordinator and agents of layout pp=2; pp_half_saved_test.py asserts
# what each checkpointer did.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
export GLOO_SOCKET_IFNAME=lo
mkdir -p "$DIR/logs" "$DIR/dcp"

start_coordinator || fail "coordinator"
start_agents pphalf pp=2 || fail "agents (pp=2)"
launch pphalf pp=2 stages tests/seeds/pp_side_by_side_rank.py --rdzv="$DIR/rdzv" --dcp="$DIR/dcp"
finish stages 240
stop_agents || fail "agents did not stop cleanly"

export TESSERA_SEED_DIR=$DIR
./client/python/run_python_test.sh tests/seeds/pp_half_saved_test.py
rc=$?
stop_coordinator || fail "coordinator did not stop cleanly"
exit "$rc"
