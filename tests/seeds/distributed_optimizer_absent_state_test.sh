#!/usr/bin/env bash
# Seed scenario distributed_optimizer_slices, through the Python module: the part of Megatron's
# report that tests/e2e (C++ trainer) does not reach — "one rank with no state yet" must be
# handled explicitly, never a KeyError-style crash.
# - dp=2: AdamW moments as flat-range slices of one buffer (a rank's slice of a parameter may
#   be empty), a frozen parameter whose state is declared tessera.Absent on every rank: the
#   save commits and verifies;
# - reloaded on dp=3 and dp=1: every slice byte-identical, and the frozen parameter's state
#   reported absent (Client.last_absent), its destinations left untouched;
# - one rank declares a parameter's state absent while the others hold it: refused with
#   OPTIMIZER_STATE_MISMATCH naming the parameter, nothing written, latest unchanged.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
mkdir -p "$DIR/logs" "$DIR/dopt"

start_coordinator || fail "coordinator"
start_agents dopt dp=2 || fail "agents (dp=2)"
run_ranks dopt dp=2 dopt-save --out "$DIR/dopt" --step 5 || fail "saving on dp=2"
expect_all_ranks dopt dp=2 dopt-save "^ok: rank [0-9]+ saved step 5 .*absent: frozen.weight"
verify_step dopt 5

run_ranks dopt dp=2 dopt-mixed --out "$DIR/dopt" --step 6 ||
  fail "state absent on one rank and present on another was not refused cleanly"
expect_all_ranks dopt dp=2 dopt-mixed \
  "^ok: rank [0-9]+: step 6 refused with OPTIMIZER_STATE_MISMATCH"
expect_not_written dopt 6
echo "ok: absent on one rank, present on the other: OPTIMIZER_STATE_MISMATCH, nothing written"

for layout in dp=3 dp=1; do
  switch_layout dopt "$layout"
  run_ranks dopt "$layout" dopt-load --out "$DIR/dopt" --step 5 || fail "loading on $layout"
  absent="frozen.weight#exp_avg,frozen.weight#exp_avg_sq,frozen.weight#step"
  expect_all_ranks dopt "$layout" dopt-load \
    "^ok: rank [0-9]+ loaded step 5 .*absent reported $absent"
  echo "ok: step 5 (dp=2) reloaded on $layout; absent state reported, slices byte-identical"
done
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: distributed optimizer with absent state: saved, verified, reloaded on dp=3 and" \
  "dp=1; absent on one rank only refused"
