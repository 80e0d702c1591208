#!/usr/bin/env bash
# Per-job serialization (issue 11, bug 3): one job's long plan never delays another job. Real
# processes on loopback, one coordinator, two jobs:
# - job B: real agents and trainers (tp=2,dp=2) with --inject_storage_fault=hold_writes=<file>:
#   its save of step 11 holds in PERSISTING, its writers waiting;
# - job A: tessera-plan-flood registers the fake agents of a 4 x 8 x 32 mesh (1,024 ranks) and
#   submits their plans of 2,000 pieces each; once every plan is in, the coordinator decides
#   A's global plan on A's strand — held there (--inject_plan_hold) until B has committed;
# - once A's plan is held, B's writers are let go; once B committed, A's plan is let go and
#   validated, which takes seconds on 2 cores.
# Asserted, from the coordinator's log (events, not timings): B's save COMMITTED while A's
# strand was taken by its plan — B's reports, commit and store writes do not queue behind
# another job's strand; A's plan is then validated; B's trainers all succeed, and no agent of
# B lost its lease while A's validation kept both cores busy (lease 6 s, heartbeats every
# second: no lease expiry or AGENT_LOST in the coordinator's log, no failed heartbeat or
# lapsed lease in B's agent logs). While held, A's strand sleeps: the commit shows that jobs'
# strands are apart; the load of A's validation meets B's agents in the lease checks.
# Every wait is bounded.
LEASE_MS=6000
source tests/faults/lib.sh

COORD_LOG="$DIR/logs/coordinator.log"
FLOOD_OUT="$DIR/logs/plan-flood.out"
RELEASE="$DIR/release-writes"
RELEASE_PLAN="$DIR/release-plan"
FLOOD_JOB="flood$$"
FLOOD_PID=""
trap 'touch "$RELEASE_PLAN"; [ -n "$FLOOD_PID" ] && kill -KILL "$FLOOD_PID" 2>/dev/null; stop_all' EXIT

start_coordinator --heartbeat_interval_ms=1000 --inject_plan_hold="$FLOOD_JOB:$RELEASE_PLAN" ||
  fail "coordinator"
start_agents "$JOB" "$LAYOUT" --inject_storage_fault="hold_writes=$RELEASE" || fail "agents"
start_save 11
wait_for_line "$DIR/logs/agent-$JOB-0.log" "fault injection: holding writes until" 60 ||
  fail "job B's writer was not held in PERSISTING"
b_session=$(sed -nE "s/.*session (\S+) opened for job $JOB step 11.*/\1/p" "$COORD_LOG" | head -n 1)
[ -n "$b_session" ] || fail "no session of job B in the coordinator's log"

"$BIN/tests/faults/tessera-plan-flood" --coordinator="127.0.0.1:$COORD_PORT" --job="$FLOOD_JOB" \
  --shards_per_rank=2000 --hold_s=300 2>"$FLOOD_OUT" &
FLOOD_PID=$!
wait_for_line "$FLOOD_OUT" "plan-flood: (all .* plans submitted|rank)" 180 ||
  fail "the fake agents of job A did not submit their plans"
grep -q "plans submitted" "$FLOOD_OUT" || fail "job A's plans were refused: $(cat "$FLOOD_OUT")"
a_session=$(sed -nE 's/.*plans submitted: session (\S+).*/\1/p' "$FLOOD_OUT")
grep -Eq "session $a_session: plan (validated|reused|rejected)" "$COORD_LOG" &&
  fail "job A's plan was decided before its last submission was answered"
echo "   $(grep "plans submitted" "$FLOOD_OUT")"
wait_for_line "$COORD_LOG" "fault injection: holding the plan of job $FLOOD_JOB" 60 ||
  fail "job A's plan was not held on its strand"
# Job A's strand is busy with its plan now: let job B's writers go.
touch "$RELEASE"
wait_for_line "$COORD_LOG" "session $b_session: COMMITTED step 11" 60 ||
  fail "job B's save did not commit while job A's plan was held: B waited for A"
grep -Eq "session $a_session: plan (validated|reused|rejected)" "$COORD_LOG" &&
  fail "job A's plan was decided before it was let go"
touch "$RELEASE_PLAN"

wait_for_line "$COORD_LOG" "session $a_session(: plan (validated|rejected)| of job .* ABORTED)" 180 ||
  fail "job A's plan was not decided"
grep "session $a_session of job .* ABORTED" "$COORD_LOG" &&
  fail "job A's session aborted before its plan was decided (its fake agents fell behind): $(cat "$FLOOD_OUT")"
grep -q "session $a_session: plan validated" "$COORD_LOG" ||
  fail "job A's plan was rejected: $(grep "session $a_session" "$COORD_LOG" | tail -n 1)"
b_line=$(grep -n "session $b_session: COMMITTED step 11" "$COORD_LOG" | head -n 1 | cut -d: -f1)
a_line=$(grep -n "session $a_session: plan validated" "$COORD_LOG" | head -n 1 | cut -d: -f1)
echo "   job B COMMITTED at $(sed -n "${b_line}p" "$COORD_LOG" | cut -c1-24), job A's plan validated at $(sed -n "${a_line}p" "$COORD_LOG" | cut -c1-24)"

for r in 0 1 2 3; do wait_trainer "$r" long_plan; done
expect_committed_status long_plan 11
grep -E "ABORTED|lost the agent" "$COORD_LOG" | grep -v "$FLOOD_JOB\|$a_session" &&
  fail "job B lost an agent or a session"
grep -E "lease lapsed|heartbeat failed" "$DIR"/logs/agent-"$JOB"-*.log &&
  fail "an agent of job B missed its lease"
"$CLI" verify "$(step_dir 11)" >"$DIR/logs/verify-11.out" 2>&1 ||
  fail "step 11 does not verify: $(cat "$DIR/logs/verify-11.out")"

kill -TERM "$FLOOD_PID"
wait "$FLOOD_PID" 2>/dev/null
FLOOD_PID=""
finish
echo "PASS: job B saved and committed while job A's 1,024-rank plan was held on its strand; A's plan validated after; no agent of B lost its lease"
