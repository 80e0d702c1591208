#!/usr/bin/env bash
# Fault matrix (issue 6), real processes on loopback, tp=2,dp=2, agents commit
# (--coordinator_commits=false):
# - planning_agent_kill: an agent SIGKILLed while the session is in PLANNING (its plan is in,
#   another rank's is not yet) -> ABORTED AGENT_LOST naming it;
# - committing_agent_kill: the committer agent SIGKILLed when it receives COMMIT -> another
#   agent with the storage mounted commits; the checkpoint verifies and loads;
# - trainer_kill_waiting_for_slots: a trainer SIGKILLed while blocked in Save (BeginSave, waiting
#   for the other ranks' plans) -> its agent sees the call cancelled, ABORTED AGENT_LOST naming
#   the rank at once (not at a phase timeout);
# - trainer_kill_during_copy: a trainer SIGKILLed in the middle of its copy into staging (after
#   the slots were handed out, before Save returns) -> ABORTED TIMEOUT naming the rank when the
#   COPYING deadline passes (the agent cannot see a trainer die between calls);
# each: nothing of the failed step committed, the previous latest verifies and loads byte for
# byte, the reason is in `tessera status`, and every process ends within a bound.
source tests/faults/lib.sh
ulimit -c 0

start_coordinator --coordinator_commits=false --copying_timeout_s=6 || fail "coordinator"
start_agents "$JOB" "$LAYOUT" || fail "agents"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10 "${MODEL[@]}" || fail "first save"
[ "$(latest_step)" = "step-000000010" ] || fail "step 10 not committed"
expect_committed_status first 10

# start_rank R FLAGS...: one trainer in the background (pid in RANK_PID[R]; the trainer
# itself, so a kill reaches it; wait_trainers_end bounds it).
declare -A RANK_PID
start_rank() {
  local r=$1; shift
  "$BIN/examples/tessera-llama-trainer" \
    --agent_socket="$SOCK_DIR/$JOB-$r.sock" "$@" >"$DIR/logs/trainer-$JOB-$r.out" 2>&1 &
  RANK_PID[$r]=$!
  TRAINER_PIDS+=($!)
}
# wait_planning STEP RANKS: the coordinator shows STEP in PLANNING (bounded).
wait_planning() {
  local waited=0 json="$DIR/logs/status-planning.json"
  until status_json "$JOB" >"$json" 2>/dev/null &&
    [ "$(status_field "$json" 's["state"]')" = "SESSION_STATE_PLANNING" ] &&
    [ "$(status_field "$json" 's["step"]')" = "$1" ]; do
    [ $waited -lt 300 ] || fail "step $1 never reached PLANNING"
    sleep 0.1
    waited=$((waited + 1))
  done
}
# wait_plans STEP R...: those ranks' agents had their plans of STEP accepted (bounded).
wait_plans() {
  local step=$1 r; shift
  for r in "$@"; do
    wait_for_line "$DIR/logs/agent-$JOB-$r.log" "plan of step $step submitted" 30 ||
      fail "rank $r's plan of step $step was not accepted"
  done
}
# wait_trainers_end R...: those trainers end on their own within TRAINER_TIMEOUT.
wait_trainers_end() {
  local r
  for r in "$@"; do
    wait_pid_bounded "${RANK_PID[$r]}" "$TRAINER_TIMEOUT" "trainer $r"
    TRAINER_RC[$r]=$WAITED_RC
  done
}
declare -A TRAINER_RC

# --- planning_agent_kill ---------------------------------------------------------------------
aborts=$(count_lines "$DIR/logs/coordinator.log" "ABORTED")
TRAINER_PIDS=()
for r in 0 1 2; do start_rank $r --mode=save --steps=11 "${MODEL[@]}"; done
wait_planning 11
wait_plans 11 0 1 2  # rank 3's never comes: the session stays in PLANNING
kill -KILL "${AGENT_PIDS[1]}"
wait_aborts_beyond "$aborts" 20
wait_trainers_end 0 1 2
for r in 0 1 2; do [ "${TRAINER_RC[$r]}" -ne 0 ] || fail "trainer $r succeeded after its save aborted"; done
expect_aborted_status planning_agent_kill AGENT_LOST "rank 1"
grep "ABORTED" "$DIR/logs/coordinator.log" | tail -n 1 | grep -q "PLANNING" ||
  fail "the abort does not say it happened during PLANNING"
expect_not_committed 11
restart_agent 1
echo "ok: planning_agent_kill -> AGENT_LOST rank 1 during PLANNING"

# --- committing_agent_kill -------------------------------------------------------------------
# Rank 0 is the committer the coordinator picks (the lowest live rank with the storage).
restart_agent 0 --crash_on=commit
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=12 "${MODEL[@]}"
wait_for_line "$DIR/logs/agent-$JOB-0.log" "fault injection: crashing on commit" 20 ||
  fail "the committer did not crash on COMMIT"
wait_for_line "$DIR/logs/coordinator.log" "committer rank 0 lost; rank 1 commits" 20 ||
  fail "no other committer took over"
wait_for_line "$DIR/logs/coordinator.log" "COMMITTED step 12" 30 || fail "step 12 did not commit"
for r in 1 2 3; do
  grep -q "step 12 committed" "$DIR/logs/trainer-$JOB-$r.out" ||
    fail "trainer $r did not see step 12 commit"
done
"$CLI" verify "$(step_dir 12)" >"$DIR/logs/verify-12.out" 2>&1 ||
  fail "step 12 committed by the replacement committer does not verify"
expect_committed_status committing_agent_kill 12
restart_agent 0
expect_latest_intact 12
echo "ok: committing_agent_kill -> rank 1 committed step 12 instead; verified and loaded"

# --- trainer_kill_waiting_for_slots ----------------------------------------------------------
aborts=$(count_lines "$DIR/logs/coordinator.log" "ABORTED")
TRAINER_PIDS=()
for r in 0 1 2; do start_rank $r --mode=save --steps=13 "${MODEL[@]}"; done
wait_planning 13
wait_plans 13 0 1 2
kill -KILL "${RANK_PID[2]}"   # blocked in Save (BeginSave): its slots are not handed out yet
wait "${RANK_PID[2]}" 2>/dev/null
wait_aborts_beyond "$aborts" 20
wait_trainers_end 0 1
for r in 0 1; do [ "${TRAINER_RC[$r]}" -ne 0 ] || fail "trainer $r succeeded after its save aborted"; done
expect_aborted_status trainer_kill_waiting_for_slots AGENT_LOST "rank 2"
grep -q "the trainer of rank 2 went away" "$DIR/logs/coordinator.log" "$DIR/logs/agent-$JOB-2.log" ||
  fail "the abort does not say the trainer went away"
expect_not_committed 13
expect_latest_intact 12
echo "ok: trainer_kill_waiting_for_slots -> AGENT_LOST rank 2 at once"

# --- trainer_kill_during_copy ----------------------------------------------------------------
aborts=$(count_lines "$DIR/logs/coordinator.log" "ABORTED")
TRAINER_PIDS=()
for r in 0 1 3; do start_rank $r --mode=save --steps=14 "${MODEL[@]}"; done
start_rank 2 --mode=save --steps=14 "${MODEL[@]}" --kill_during_copy
wait_trainers_end 2
grep -q "killed during the copy into staging" "$DIR/logs/trainer-$JOB-2.out" ||
  fail "trainer 2 did not die during its copy: $(cat "$DIR/logs/trainer-$JOB-2.out")"
grep -q "staged" "$DIR/logs/trainer-$JOB-2.out" && fail "trainer 2's Save returned before it died"
grep -q "slots handed to the trainer for" "$DIR/logs/agent-$JOB-2.log" ||
  fail "agent 2 never handed out the slots"
wait_aborts_beyond "$aborts" 30
wait_trainers_end 0 1 3
for r in 0 1 3; do [ "${TRAINER_RC[$r]}" -ne 0 ] || fail "trainer $r succeeded after its save aborted"; done
expect_aborted_status trainer_kill_during_copy TIMEOUT "rank 2"
expect_not_committed 14
expect_latest_intact 12
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=15 "${MODEL[@]}" ||
  fail "a save after the faults failed"
"$CLI" verify "$(step_dir 15)" >"$DIR/logs/verify-15.out" 2>&1 || fail "step 15 does not verify"
expect_committed_status later_save 15
echo "ok: trainer_kill_during_copy -> TIMEOUT rank 2 (COPYING deadline); step 15 saves after"

finish
echo "PASS: agent kill in PLANNING and COMMITTING, trainer kill before Save returns (waiting and copying)"
