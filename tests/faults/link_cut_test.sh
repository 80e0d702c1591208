#!/usr/bin/env bash
# The agent <-> coordinator link cut for 5 s during PERSISTING (issue 11, bug 2). Real
# processes on loopback, tp=2,dp=2; the agents dial the coordinator through link_proxy.py, a
# TCP proxy this test cuts (every connection reset, new ones refused) and restores.
# - every agent runs with --inject_storage_fault=hold_writes=<file>: the save of step 11 holds
#   in PERSISTING, its writers waiting, until the test creates the file;
# - the link is cut; then the writers are let go: they write, and their reports fail against
#   the cut link (the test waits until an agent logged a failed report);
# - after 5 s the link is restored. The agents must re-send their reports (after
#   re-registering and reconnecting their command streams), so the save commits within
#   COMMIT_BOUND_S (30 s) of the restoration. Every phase deadline is 600 s and the lease 20 s,
#   so neither a timeout nor a lost agent can end the session within that bound: only
#   re-sending can make it commit in time.
# Then: COMMITTED in `tessera status`, no ABORTED, `tessera verify` passes, and the trainers
# load it byte for byte through the restored link. Every wait is bounded.
LEASE_MS=20000
source tests/faults/lib.sh

CUT_S=5
COMMIT_BOUND_S=30
COORD_LOG="$DIR/logs/coordinator.log"
PROXY_OUT="$DIR/logs/link_proxy.out"
RELEASE="$DIR/release-writes"
PROXY_PID=""
trap '[ -n "$PROXY_PID" ] && kill -TERM "$PROXY_PID" 2>/dev/null; stop_all' EXIT

# now_ms: wall-clock milliseconds.
now_ms() { echo $(($(date +%s%N) / 1000000)); }

start_coordinator --planning_timeout_s=600 --pinning_timeout_s=600 --copying_timeout_s=600 \
  --persisting_timeout_s=600 --committing_timeout_s=600 || fail "coordinator"

/usr/bin/python3 tests/faults/link_proxy.py --target="127.0.0.1:$COORD_PORT" >"$PROXY_OUT" 2>&1 &
PROXY_PID=$!
wait_for_line "$PROXY_OUT" "listening on" 20 || fail "the link proxy did not start"
PROXY_PORT=$(sed -nE 's/.*listening on 127\.0\.0\.1:([0-9]+).*/\1/p' "$PROXY_OUT" | head -n 1)
# Agents dial the proxy; the CLI and the checks below talk to the coordinator directly.
coordinator_address() { echo "127.0.0.1:$PROXY_PORT"; }

start_agents "$JOB" "$LAYOUT" --inject_storage_fault="hold_writes=$RELEASE" || fail "agents"
coord_offset=$(log_offset "$COORD_LOG")
start_save 11
wait_for_line "$DIR/logs/agent-$JOB-0.log" "fault injection: holding writes until" 60 ||
  fail "the writer of rank 0 was not held in PERSISTING"
status_json "$JOB" >"$DIR/logs/status-held.json" || fail "tessera status failed"
[ "$(status_field "$DIR/logs/status-held.json" 's["state"]')" = SESSION_STATE_PERSISTING ] ||
  fail "the save is not PERSISTING while its writers are held: $(cat "$DIR/logs/status-held.json")"

# Cut the link, then let the writers go: their reports meet the cut link.
failed_reports="report .*(failed|not delivered)"
reports_before=$(agent_logs | grep -Ec "$failed_reports")
kill -USR1 "$PROXY_PID"
wait_for_line "$PROXY_OUT" "cut: reset" 10 || fail "the link proxy did not cut the link"
cut_at=$(now_ms)
touch "$RELEASE"
wait_until 30 agent_lines_above "$failed_reports" "$reports_before" ||
  fail "no agent's report failed while the link was cut"
echo "   link cut; a report failed: $(agent_logs | grep -E "$failed_reports" | tail -n 1 | cut -c1-160)"
log_since "$COORD_LOG" "$coord_offset" | grep -q "COMMITTED step 11" &&
  fail "step 11 committed while the link was cut"
# The outage lasts CUT_S seconds: its length is the fault, not a wait for an event.
while [ $(($(now_ms) - cut_at)) -lt $((CUT_S * 1000)) ]; do sleep 0.1; done
kill -USR2 "$PROXY_PID"
wait_for_line "$PROXY_OUT" "restored" 10 || fail "the link proxy did not restore the link"
restored_at=$(now_ms)

wait_for_line_since "$COORD_LOG" "$coord_offset" "COMMITTED step 11" "$COMMIT_BOUND_S" ||
  fail "step 11 did not commit within ${COMMIT_BOUND_S}s after the link returned (reports not re-sent; the phase deadlines are 600 s)"
echo "   step 11 committed $(( ($(now_ms) - restored_at) )) ms after the link returned"
for r in 0 1 2 3; do wait_trainer "$r" link_cut; done
log_since "$COORD_LOG" "$coord_offset" | grep "ABORTED" && fail "a session aborted"
expect_committed_status link_cut 11
grep -q "lease lapsed" "$DIR"/logs/agent-"$JOB"-*.log && fail "an agent's lease lapsed"
expect_latest_intact 11
finish
kill -TERM "$PROXY_PID"
wait_pid_bounded "$PROXY_PID" 10 "the link proxy"
PROXY_PID=""
echo "PASS: a 5 s link cut during PERSISTING: the reports were re-sent and the save committed within seconds after the link returned"
