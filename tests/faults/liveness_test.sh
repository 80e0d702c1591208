#!/usr/bin/env bash
# Liveness that tells a pause from a death (issue 52). Real processes on loopback, tp=2,dp=2.
# CASE picks one fault; each case prints the time from the fault (or the refusal) to the last
# rank's answer, and fails if it passes its bound:
#
# - agent_death: the shipped lease (10 s, heartbeat 2 s). A save of step 11 waits in PLANNING
#   for rank 3's plan; rank 3's agent is SIGKILLed: every other rank's save ends with
#   AGENT_LOST naming rank 3 within DEATH_BOUND_MS (3 s), long before the lease. Then the same
#   with SIGTERM (step 12).
# - refusals: rank 3's agent runs with another layout (tp=4) and its registration is refused:
#   its trainer is told so (UNAVAILABLE, naming the refusal), and the other ranks' saves end
#   with LAYOUT_MISMATCH naming rank 3 within REFUSAL_BOUND_MS (3 s). Then rank 1's client
#   refuses its own tensors (a box outside the global shape, --box_outside_shape): once as the
#   last rank to arrive (the others wait in PLANNING), once as the first; each time every
#   other rank's save ends with the client's reason, naming rank 1, within the bound (the
#   planning timeout is 60 s, so only the refusal can end it in time).
# - coordinator_pause: lease 2 s. The coordinator is SIGSTOPped for 5 s (2.5 leases), twice
#   while a save waits in PLANNING and once in PERSISTING with every chunk being written, then
#   SIGCONT: each save commits (no AGENT_LOST), within COMMIT_BOUND_MS (3 s) of the resume.
#   A pause of the judge is not a death of the judged.
# Every case: nothing incomplete committed, the previous latest verifies and loads.
case "${CASE:?CASE must be agent_death, refusals or coordinator_pause}" in
  agent_death | refusals) LEASE_MS=10000 ;;
  coordinator_pause) LEASE_MS=2000 ;;
  *) echo "unknown CASE $CASE"; exit 2 ;;
esac
source tests/faults/lib.sh
ulimit -c 0

DEATH_BOUND_MS=3000
REFUSAL_BOUND_MS=3000
COMMIT_BOUND_MS=3000
PAUSE_S=5
COORD_LOG="$DIR/logs/coordinator.log"

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# start_rank R FLAGS...: one trainer in the background (pid in RANK_PID[R]).
declare -A RANK_PID RANK_RC
start_rank() {
  local r=$1; shift
  timeout "$TRAINER_TIMEOUT" "$BIN/examples/tessera-llama-trainer" \
    --agent_socket="$SOCK_DIR/$JOB-$r.sock" "$@" >"$DIR/logs/trainer-$JOB-$r.out" 2>&1 &
  RANK_PID[$r]=$!
  TRAINER_PIDS+=($!)
}
# wait_plans STEP R...: those ranks' agents had their plans of STEP accepted (bounded).
wait_plans() {
  local step=$1 r; shift
  for r in "$@"; do
    wait_for_line "$DIR/logs/agent-$JOB-$r.log" "plan of step $step submitted" 30 ||
      fail "rank $r's plan of step $step was not accepted"
  done
}
# answered_within SINCE_MS BOUND_MS WHAT R...: waits until the trainers of ranks R... exited
# (their exit codes in RANK_RC), prints how long after SINCE_MS the last one did, and fails
# the test if that is longer than BOUND_MS. Waits at most TRAINER_TIMEOUT in all, so a rank
# that is never answered shows as a failed bound, not a hang.
answered_within() {
  local since=$1 bound=$2 what=$3 r pending last elapsed
  shift 3
  while :; do
    pending=0
    for r in "$@"; do kill -0 "${RANK_PID[$r]}" 2>/dev/null && pending=1; done
    [ "$pending" = 0 ] && break
    [ $(($(now_ms) - since)) -lt $((TRAINER_TIMEOUT * 1000)) ] ||
      fail "$what: ranks $* not all answered within ${TRAINER_TIMEOUT}s"
    sleep 0.05
  done
  last=$(now_ms)
  for r in "$@"; do
    wait "${RANK_PID[$r]}" 2>/dev/null
    RANK_RC[$r]=$?
    [ "${RANK_RC[$r]}" -eq 124 ] && fail "$what: trainer $r hung (killed after ${TRAINER_TIMEOUT}s)"
  done
  elapsed=$((last - since))
  echo "   $what: every rank (${*}) answered $elapsed ms after the fault (bound $bound ms)"
  [ "$elapsed" -le "$bound" ] || fail "$what: the last rank was answered after $elapsed ms, over $bound ms"
}
# expect_failed_with WHAT REGEX R...: those trainers failed, and each one's output matches REGEX.
expect_failed_with() {
  local what=$1 regex=$2 r
  shift 2
  for r in "$@"; do
    [ "${RANK_RC[$r]}" -ne 0 ] || fail "$what: trainer $r succeeded"
    grep -Eq -- "$regex" "$DIR/logs/trainer-$JOB-$r.out" ||
      fail "$what: trainer $r was not told /$regex/: $(tail -n 2 "$DIR/logs/trainer-$JOB-$r.out")"
  done
}

first_save() {
  start_agents "$JOB" "$LAYOUT" || fail "agents"
  run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10 "${MODEL[@]}" || fail "first save"
  [ "$(latest_step)" = "step-000000010" ] || fail "step 10 not committed"
}

case "$CASE" in
agent_death)
  start_coordinator --heartbeat_interval_ms=2000 || fail "coordinator"
  first_save
  step=11
  for sig in KILL TERM; do
    TRAINER_PIDS=()
    for r in 0 1 2; do start_rank $r --mode=save --steps=$step "${MODEL[@]}"; done
    wait_plans $step 0 1 2  # rank 3's never comes: the session waits in PLANNING
    at=$(now_ms)
    kill -"$sig" "${AGENT_PIDS[3]}"
    answered_within "$at" "$DEATH_BOUND_MS" "agent 3 SIG$sig in PLANNING" 0 1 2
    expect_failed_with "SIG$sig" "lost the agent of rank 3 during PLANNING" 0 1 2
    expect_aborted_status "sig$sig" AGENT_LOST "rank 3"
    expect_not_committed $step
    wait "${AGENT_PIDS[3]}" 2>/dev/null
    mark_agent_log "$JOB" 3
    start_agent "$JOB" "$LAYOUT" 3
    wait_registered "$JOB" 3 || fail "agent 3 did not register again"
    step=$((step + 1))
  done
  expect_latest_intact 10
  finish
  echo "PASS: a killed or stopped agent is found lost within ${DEATH_BOUND_MS} ms, not at its 10 s lease"
  ;;

refusals)
  start_coordinator --heartbeat_interval_ms=2000 --planning_timeout_s=60 || fail "coordinator"
  first_save
  # Rank 3's agent comes back with another layout: the job's (tp=2,dp=2) stays, so it is refused.
  stop_process "${AGENT_PIDS[3]}" 10 || fail "agent 3 did not stop"
  : >"$DIR/logs/agent-$JOB-3.log"
  start_agent "$JOB" "tp=4" 3
  wait_for_line "$DIR/logs/agent-$JOB-3.log" "registration rejected" 30 ||
    fail "agent 3's registration with tp=4 was not rejected"
  TRAINER_PIDS=()
  at=$(now_ms)
  for r in 0 1 2 3; do start_rank $r --mode=save --steps=11 "${MODEL[@]}"; done
  answered_within "$at" "$REFUSAL_BOUND_MS" "rank 3's registration refused" 0 1 2 3
  expect_failed_with "registration refused" "UNAVAILABLE.*refused this agent's registration.*layout" 3
  expect_failed_with "registration refused" "rank 3 during PLANNING \\(its registration was refused" 0 1 2
  expect_aborted_status registration_refused LAYOUT_MISMATCH "rank 3"
  expect_not_committed 11
  stop_process "${AGENT_PIDS[3]}" 10 || fail "agent 3 (tp=4) did not stop"
  mark_agent_log "$JOB" 3
  start_agent "$JOB" "$LAYOUT" 3
  wait_registered "$JOB" 3 || fail "agent 3 did not register with the job's layout"

  # Rank 1's client refuses its tensors, arriving last: the others wait in PLANNING for it.
  TRAINER_PIDS=()
  for r in 0 2 3; do start_rank $r --mode=save --steps=12 "${MODEL[@]}"; done
  wait_plans 12 0 2 3
  at=$(now_ms)
  start_rank 1 --mode=save --steps=12 "${MODEL[@]}" --box_outside_shape
  answered_within "$at" "$REFUSAL_BOUND_MS" "rank 1's client refused its plan (last)" 0 1 2 3
  expect_failed_with "plan refused (last)" "INVALID_ARGUMENT.*outside" 1
  expect_failed_with "plan refused (last)" "rank 1 refused its tensors for step 12: .*outside" 0 2 3
  expect_aborted_status plan_refused_last MALFORMED_SHARD "rank 1"
  expect_not_committed 12

  # ... and arriving first: the others' plans come after its refusal.
  TRAINER_PIDS=()
  at=$(now_ms)
  start_rank 1 --mode=save --steps=13 "${MODEL[@]}" --box_outside_shape
  answered_within "$at" "$REFUSAL_BOUND_MS" "rank 1's client refused its plan" 1
  at=$(now_ms)
  for r in 0 2 3; do start_rank $r --mode=save --steps=13 "${MODEL[@]}"; done
  answered_within "$at" "$REFUSAL_BOUND_MS" "the ranks after rank 1's refusal (first)" 0 2 3
  expect_failed_with "plan refused (first)" "rank 1 refused its tensors for step 13: .*outside" 0 2 3
  expect_not_committed 13

  run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=14 "${MODEL[@]}" ||
    fail "a save after the refusals failed"
  expect_committed_status after_refusals 14
  expect_latest_intact 14
  finish
  echo "PASS: a refused registration and a refused plan reach every rank within ${REFUSAL_BOUND_MS} ms, with their reason"
  ;;

coordinator_pause)
  RELEASE="$DIR/release-writes"
  start_coordinator --planning_timeout_s=600 --pinning_timeout_s=600 --copying_timeout_s=600 \
    --persisting_timeout_s=600 --committing_timeout_s=600 || fail "coordinator"
  first_save
  # pause_coordinator: SIGSTOP for PAUSE_S seconds (the pause is the fault, not a wait for an
  # event), then SIGCONT; sets RESUMED_AT.
  pause_coordinator() {
    local stopped_at
    kill -STOP "$COORD_PID"
    stopped_at=$(now_ms)
    while [ $(($(now_ms) - stopped_at)) -lt $((PAUSE_S * 1000)) ]; do sleep 0.1; done
    kill -CONT "$COORD_PID"
    RESUMED_AT=$(now_ms)
  }
  for step in 11 12; do
    TRAINER_PIDS=()
    for r in 0 1 2; do start_rank $r --mode=save --steps=$step "${MODEL[@]}"; done
    wait_plans $step 0 1 2
    pause_coordinator
    start_rank 3 --mode=save --steps=$step "${MODEL[@]}"
    answered_within "$RESUMED_AT" "$COMMIT_BOUND_MS" "coordinator paused ${PAUSE_S}s in PLANNING" 0 1 2 3
    for r in 0 1 2 3; do
      [ "${RANK_RC[$r]}" -eq 0 ] ||
        fail "step $step: trainer $r failed after the pause: $(tail -n 2 "$DIR/logs/trainer-$JOB-$r.out")"
    done
    expect_committed_status "pause_planning_$step" $step
  done

  # In PERSISTING, every writer held until the coordinator is stopped, then let go: the
  # chunks are written while it is paused, and their reports wait for it.
  stop_agents || fail "agents did not stop"
  start_agents "$JOB" "$LAYOUT" --inject_storage_fault="hold_writes=$RELEASE" || fail "agents"
  TRAINER_PIDS=()
  for r in 0 1 2 3; do start_rank $r --mode=save --steps=13 "${MODEL[@]}"; done
  wait_for_line "$DIR/logs/agent-$JOB-0.log" "fault injection: holding writes until" 60 ||
    fail "the writer of rank 0 was not held in PERSISTING"
  kill -STOP "$COORD_PID"
  stopped_at=$(now_ms)
  touch "$RELEASE"
  while [ $(($(now_ms) - stopped_at)) -lt $((PAUSE_S * 1000)) ]; do sleep 0.1; done
  kill -CONT "$COORD_PID"
  RESUMED_AT=$(now_ms)
  answered_within "$RESUMED_AT" "$COMMIT_BOUND_MS" "coordinator paused ${PAUSE_S}s in PERSISTING" 0 1 2 3
  for r in 0 1 2 3; do
    [ "${RANK_RC[$r]}" -eq 0 ] ||
      fail "step 13: trainer $r failed after the pause: $(tail -n 2 "$DIR/logs/trainer-$JOB-$r.out")"
  done
  grep -q "AGENT_LOST\|ABORTED" "$COORD_LOG" && fail "a save aborted: $(grep -m1 "ABORTED" "$COORD_LOG")"
  expect_committed_status pause_persisting 13
  expect_latest_intact 13
  finish
  echo "PASS: a coordinator paused for 2.5 leases loses no save: each committed within ${COMMIT_BOUND_MS} ms of the resume"
  ;;
esac
