#!/usr/bin/env bash
# The commit edge (issue 11), end to end: a fault right after the commit's rename. Real
# processes on loopback, tp=2,dp=2. COMMITTER=coordinator (default) or agent
# (--coordinator_commits=false: a committer agent commits).
# - fsync_after_rename: the committer's storage runs with
#   --inject_storage_fault=eio:syncdir_after_dir_rename=3: the step's directory is renamed into
#   place, then the parent's fsync fails three times. While it fails, the session is COMMITTING
#   (never ABORTED) with its directory in place; the committer retries with backoff (the
#   coordinator's "unresolved, will retry", or the agent's "is unresolved ...; retrying") and
#   the step ends COMMITTED. The phase deadline is the default (120 s), far beyond the wait.
# - crash_after_rename: the committer runs with --inject_storage_fault=crash_after_dir_rename
#   and is SIGKILLed right after the rename. The coordinator committer is restarted on the
#   same RocksDB and port; the committer agent is replaced by another agent once its lease
#   expired. The step ends COMMITTED.
# Each: `tessera status` shows COMMITTED at the step, `tessera checkpoints` lists it, no ABORTED
# for it in the coordinator's log, `tessera verify` passes and the trainers load it byte for
# byte. Every wait is bounded.
source tests/faults/lib.sh

COMMITTER=${COMMITTER:-coordinator}
case "$COMMITTER" in
  coordinator) COORD_FLAGS=() ;;
  agent) COORD_FLAGS=(--coordinator_commits=false) ;;
  *) fail "COMMITTER must be coordinator or agent, not $COMMITTER" ;;
esac
COORD_LOG="$DIR/logs/coordinator.log"
FSYNC_FAULT=eio:syncdir_after_dir_rename=3
CRASH_FAULT=crash_after_dir_rename

# restart_agents [FLAGS...]: every agent restarted with FLAGS (restart_agent).
restart_agents() {
  local r
  for r in 0 1 2 3; do restart_agent "$r" "$@"; done
}

# expect_committed_and_loads CASE STEP COORD_LOG_OFFSET: the step ended COMMITTED and nothing
# logged since the offset aborted it; it is listed, verifies and loads byte for byte.
expect_committed_and_loads() {
  local name=$1 step=$2 offset=$3
  expect_committed_status "$name" "$step"
  log_since "$COORD_LOG" "$offset" | grep "ABORTED" &&
    fail "$name: the coordinator aborted a session after the fault"
  "$CLI" checkpoints --json --coordinator="127.0.0.1:$COORD_PORT" "$JOB" \
    >"$DIR/logs/checkpoints-$name.json" 2>&1 || fail "$name: tessera checkpoints failed"
  grep -Eq "\"step\": *\"?$step\"?," "$DIR/logs/checkpoints-$name.json" ||
    fail "$name: tessera checkpoints does not list step $step: $(cat "$DIR/logs/checkpoints-$name.json")"
  expect_latest_intact "$step"
}

start_coordinator "${COORD_FLAGS[@]}" || fail "coordinator"
start_agents "$JOB" "$LAYOUT" || fail "agents"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10 "${MODEL[@]}" || fail "first save"
[ "$(latest_step)" = "step-000000010" ] || fail "step 10 not committed"

# --- fsync_after_rename ----------------------------------------------------------------------
if [ "$COMMITTER" = coordinator ]; then
  restart_coordinator --inject_storage_fault="$FSYNC_FAULT"
  unresolved="commit of .* unresolved, will retry: .*Input/output error"
else
  restart_agents --inject_storage_fault="$FSYNC_FAULT"
  unresolved="commit of .* is unresolved .*Input/output error.*retrying"
fi
coord_offset=$(log_offset "$COORD_LOG")
agent_unresolved=$(agent_logs | grep -Ec "$unresolved")
start_save 11
if [ "$COMMITTER" = coordinator ]; then
  wait_for_line_since "$COORD_LOG" "$coord_offset" "$unresolved" 60 ||
    fail "fsync_after_rename: the coordinator did not retry its unresolved commit"
else
  wait_until 20 agent_lines_above "$unresolved" "$agent_unresolved" ||
    fail "fsync_after_rename: the committer agent did not retry its unresolved commit (an agent that reports its commit failure and stops is the old behaviour)"
fi
# The fsync failed after the rename: the directory is in place, the session still COMMITTING.
# (The next attempt comes after a backoff of at least 100 ms, and two more must fail.)
[ -f "$(step_dir 11)/manifest.pb" ] || fail "fsync_after_rename: step 11 was not renamed into place"
status_json "$JOB" >"$DIR/logs/status-during-fault.json" || fail "tessera status failed"
state=$(status_field "$DIR/logs/status-during-fault.json" 's["state"]')
[ "$state" = SESSION_STATE_COMMITTING ] || [ "$state" = SESSION_STATE_COMMITTED ] ||
  fail "fsync_after_rename: the session is $state while its directory is in place"
echo "   while the parent's fsync fails: $state, step 11's directory in place"
for r in 0 1 2 3; do wait_trainer "$r" fsync_after_rename; done
expect_committed_and_loads fsync_after_rename 11 "$coord_offset"
echo "ok: fsync_after_rename ($COMMITTER commits) -> retried, COMMITTED, verified, loaded"

# --- crash_after_rename ----------------------------------------------------------------------
if [ "$COMMITTER" = coordinator ]; then
  restart_coordinator --inject_storage_fault="$CRASH_FAULT"
else
  restart_agents --inject_storage_fault="$CRASH_FAULT"
fi
coord_offset=$(log_offset "$COORD_LOG")
agent_crashes=$(agent_logs | grep -c "fault injection: crashing after renaming")
start_save 12
if [ "$COMMITTER" = coordinator ]; then
  wait_pid_bounded "$COORD_PID" 60 "the coordinator armed to crash after the rename"
  [ "$WAITED_RC" -eq 137 ] || fail "crash_after_rename: the coordinator exited $WAITED_RC, not SIGKILL"
  COORD_PID=""
  log_since "$COORD_LOG" "$coord_offset" | grep -q "fault injection: crashing after renaming" ||
    fail "crash_after_rename: the coordinator did not crash after the rename"
  [ -f "$(step_dir 12)/manifest.pb" ] || fail "crash_after_rename: step 12 was not renamed into place"
  coord_offset=$(log_offset "$COORD_LOG")
  restart_coordinator
  for r in 0 1 2 3; do wait_trainer "$r" crash_after_rename; done
else
  # The committer agent dies after its rename; the coordinator picks another committer once
  # its lease expired (LEASE_MS), which finds the directory in place and completes the commit.
  wait_until 60 agent_lines_above "fault injection: crashing after renaming" "$agent_crashes" ||
    fail "crash_after_rename: no committer agent crashed after its rename"
  committer=""
  for r in 0 1 2 3; do
    grep -q "fault injection: crashing after renaming" "$DIR/logs/agent-$JOB-$r.log" && committer=$r
  done
  wait_pid_bounded "${AGENT_PIDS[$committer]}" 10 "committer agent $committer"
  [ "$WAITED_RC" -eq 137 ] || fail "crash_after_rename: agent $committer exited $WAITED_RC, not SIGKILL"
  [ -f "$(step_dir 12)/manifest.pb" ] || fail "crash_after_rename: step 12 was not renamed into place"
  # Every other rank's trainer hears COMMITTED (the committer's own lost its agent).
  for r in 0 1 2 3; do
    if [ "$r" = "$committer" ]; then
      wait_pid_bounded "${TRAINER_PIDS[$r]}" "$TRAINER_TIMEOUT" "trainer $r"
    else
      wait_trainer "$r" crash_after_rename
    fi
  done
  log_since "$COORD_LOG" "$coord_offset" | grep -q "committer rank $committer lost" ||
    fail "crash_after_rename: the coordinator did not replace the lost committer"
  restart_agent "$committer"
fi
expect_committed_and_loads crash_after_rename 12 "$coord_offset"
echo "ok: crash_after_rename ($COMMITTER commits) -> COMMITTED, verified, loaded"

ls "$DIR/ckpt/$JOB" | grep -q '\.tmp-' && fail "temporary directories left: $(ls "$DIR/ckpt/$JOB")"
finish
echo "PASS: a fault right after the commit's rename ($COMMITTER commits) ends COMMITTED and loads; never ABORTED with the directory in place"
