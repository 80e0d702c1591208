#!/usr/bin/env bash
# End-to-end recovery (real processes, loopback, pp=1,tp=2,dp=2 with distributed-optimizer
# slices): the coordinator is SIGKILLed right after it persists a session's entry into each
# state, then restarted on the same RocksDB and port. Every save must COMMIT: the restarted
# coordinator recovers the session in the state it crashed in, tells the agents to re-send
# what it does not keep, and drives the save on (the commit is redone idempotently). Asserted
# for each state, from what the restarted coordinator says and logs — its log is read only
# from its restart on (a restart appends to the same file):
# - the armed coordinator logged the crash in that state and died of SIGKILL;
# - the restarted one recovered the session in that state (COMMITTED: it replays the outcome
#   to the agents, whose trainers would otherwise wait for it forever) and logged no ABORTED;
# - every trainer's save returned committed, `tessera status` shows COMMITTED at the step,
#   the directory verifies, and no temporary directory is left.
# With STORAGE=s3 the checkpoints go to a real S3 server (SeaweedFS on loopback): the commit is
# the manifest's conditional PUT, redone idempotently the same way (the object store's leftover
# session directories are retention's, checked in format/object_store_checkpoint_test).
# Every wait is bounded.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
# Long enough that the coordinator's restart and the agents' re-registration fit in it on a
# loaded 2-core CI machine: an agent whose lease lapses meanwhile refuses to write a save it
# began before (agent/save/save_core.h R5), and this test expects every save to commit.
LEASE_MS=10000
LAYOUT=tp=2,dp=2
TRAINER_TIMEOUT=90
COORD_LOG="$DIR/logs/coordinator.log"
CLI="$BIN/client/cli/tessera"
trap stop_all EXIT
fail() {
  echo "FAIL: $*"
  tail -n 6 "$DIR"/logs/*.out 2>/dev/null
  echo "--- the coordinator's log since its last restart:"
  log_since "$COORD_LOG" "${since:-0}" | tail -n 20
  exit 1
}

# no_tmp_dir: true once the job's directory holds no temporary directory (the coordinator
# removes an aborted attempt's after the commit).
no_tmp_dir() { [ "${STORAGE:-}" = s3 ] || ! ls "$DIR/ckpt/job" | grep -q '\.tmp-'; }

# wait_exit PID TIMEOUT_S: waits for a child to exit; fails the test if it does not within
# TIMEOUT_S. Sets EXIT_RC.
wait_exit() {
  wait_until "$2" exited "$1" || fail "process $1 did not exit within $2 s"
  wait "$1" 2>/dev/null
  EXIT_RC=$?
}

if [ "${STORAGE:-}" = s3 ]; then start_local_s3 tessera || fail "S3 server"; fi
start_coordinator || fail "coordinator"
start_agents job "$LAYOUT" || fail "agents"
step=0
for state in PLANNING PINNING COPYING PERSISTING COMMITTING COMMITTED; do
  step=$((step + 10))
  # Restart the coordinator armed to crash in $state (same port and RocksDB).
  stop_coordinator || fail "coordinator did not stop before $state"
  for r in 0 1 2 3; do mark_agent_log job $r; done
  since=$(log_offset "$COORD_LOG")
  start_coordinator --crash_in_state="$state" || fail "coordinator (armed for $state)"
  for r in 0 1 2 3; do wait_registered job $r || fail "agent $r did not re-register"; done
  run_trainers job "$LAYOUT" --mode=save --steps=$step --optimizer=distributed --layers=2 \
    --dim=128 &
  trainers=$!
  wait_for_line_since "$COORD_LOG" "$since" "fault injection: crashing in $state" 60 ||
    fail "the coordinator did not crash in $state"
  wait_exit "$COORD_PID" 30
  [ "$EXIT_RC" -eq 137 ] || fail "the coordinator armed for $state exited $EXIT_RC, not SIGKILL"
  COORD_PID=""

  since=$(log_offset "$COORD_LOG")
  start_coordinator || fail "coordinator restart after crashing in $state"
  session=$(log_since "$COORD_LOG" 0 | sed -nE "s/.*session (\S+) opened for job job step $step.*/\1/p" | tail -n 1)
  [ -n "$session" ] || fail "no session of step $step was opened"
  if [ "$state" != COMMITTED ]; then
    log_since "$COORD_LOG" "$since" | grep -q "recovered session $session of job job in $state" ||
      fail "the restarted coordinator did not recover session $session in $state"
  fi
  wait_exit "$trainers" $((TRAINER_TIMEOUT + 10))
  [ "$EXIT_RC" -eq 0 ] ||
    fail "step $step did not commit after a crash in $state (trainers exited $EXIT_RC)"
  dir="${STORAGE_ROOT:-$DIR/ckpt}/job/step-$(printf %09d $step)"
  [ "${STORAGE:-}" = s3 ] || [ -f "$dir/manifest.pb" ] ||
    fail "the trainers succeeded but step $step is not on disk ($state)"
  "$CLI" status --json --coordinator="127.0.0.1:$COORD_PORT" --session="$session" job \
    >"$DIR/logs/status-$step.json" 2>&1 || fail "tessera status failed"
  grep -q '"state": *"SESSION_STATE_COMMITTED"' "$DIR/logs/status-$step.json" ||
    fail "tessera status does not show step $step COMMITTED: $(cat "$DIR/logs/status-$step.json")"
  log_since "$COORD_LOG" "$since" | grep "ABORTED" &&
    fail "the restarted coordinator aborted a session after the crash in $state"
  "$CLI" verify "$dir" >"$DIR/logs/verify-$step.out" 2>&1 ||
    fail "the checkpoint committed after a crash in $state does not verify"
  wait_until 10 no_tmp_dir ||
    fail "a temporary directory is left after the crash in $state: $(ls "$DIR/ckpt/job")"
  echo "ok: crash in $state -> recovered, step $step COMMITTED and verified"
done
# The latest checkpoint loads byte for byte.
run_trainers job "$LAYOUT" --mode=load --load_step=-1 --optimizer=distributed --layers=2 \
  --dim=128 || fail "the latest checkpoint does not load after the crashes"
grep -q "loaded step $step " "$DIR/logs/trainer-job-0.out" || fail "the load did not read step $step"
echo "PASS: coordinator SIGKILLed in every phase; each save recovered, committed and verified"
