#!/usr/bin/env bash
# End-to-end recovery (real processes, loopback, pp=1,tp=2,dp=2 with distributed-optimizer
# slices): the coordinator is SIGKILLed right after it persists a session's entry into each
# state, then restarted on the same RocksDB and port. Each save must either commit complete and
# verified (agents re-register and re-report, the commit is redone idempotently) or abort with
# a reason — never a committed incomplete checkpoint, never a hang (every wait is bounded).
# COMMITTED too: the crash comes after the commit is persisted and before any agent heard it;
# the restarted coordinator must replay the outcome, or the trainers wait for it forever.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=3000
LAYOUT=tp=2,dp=2
TRAINER_TIMEOUT=90
trap stop_all EXIT
fail() {
  echo "FAIL: $*"
  tail -n 6 "$DIR"/logs/*.out "$DIR"/logs/coordinator.log 2>/dev/null
  exit 1
}

start_coordinator || fail "coordinator"
start_agents job "$LAYOUT" || fail "agents"
step=0
for state in PLANNING PINNING COPYING PERSISTING COMMITTING COMMITTED; do
  step=$((step + 10))
  # Restart the coordinator armed to crash in $state (same port and RocksDB).
  stop_coordinator || fail "coordinator did not stop before $state"
  for r in 0 1 2 3; do mark_agent_log job $r; done
  start_coordinator --crash_in_state="$state" || fail "coordinator (armed for $state)"
  for r in 0 1 2 3; do wait_registered job $r || fail "agent $r did not re-register"; done
  run_trainers job "$LAYOUT" --mode=save --steps=$step --optimizer=distributed --layers=2 \
    --dim=128 &
  trainers=$!
  wait_for_line "$DIR/logs/coordinator.log" "fault injection: crashing in $state" 60 ||
    fail "the coordinator did not crash in $state"
  wait "$COORD_PID" 2>/dev/null
  COORD_PID=""
  start_coordinator || fail "coordinator restart after crashing in $state"
  wait $trainers
  rc=$?
  dir="$DIR/ckpt/job/step-$(printf %09d $step)"
  [ "$state" = COMMITTED ] && [ $rc -ne 0 ] &&
    fail "step $step was committed before the crash, but its trainers were not told (rc $rc)"
  if [ $rc -eq 0 ]; then
    [ -f "$dir/manifest.pb" ] || fail "trainers succeeded but step $step is not committed ($state)"
    "$BIN/client/cli/tessera" verify "$dir" >"$DIR/logs/verify-$step.out" 2>&1 ||
      fail "the checkpoint committed after a crash in $state does not verify"
    echo "ok: crash in $state -> step $step committed and verified"
  else
    [ -e "$dir" ] && fail "step $step failed but its directory exists ($state)"
    grep -q "ABORTED" "$DIR/logs/coordinator.log" || fail "step $step failed without an abort reason"
    echo "ok: crash in $state -> step $step aborted: $(grep ABORTED "$DIR/logs/coordinator.log" | tail -n 1 | sed 's/.*ABORTED/ABORTED/')"
  fi
  ls "$DIR/ckpt/job" | grep -q '\.tmp-' && [ "$state" != PLANNING ] && [ $rc -eq 0 ] &&
    fail "a temporary directory is left after a committed save ($state)"
done
# Whatever happened, the latest checkpoint loads byte for byte.
run_trainers job "$LAYOUT" --mode=load --load_step=-1 --optimizer=distributed --layers=2 \
  --dim=128 || fail "the latest checkpoint does not load after the crashes"
echo "PASS: coordinator SIGKILLed in every phase; each save committed verified or aborted with a reason"
