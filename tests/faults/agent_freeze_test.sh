#!/usr/bin/env bash
# Fault matrix (issue 6): an agent frozen (SIGSTOP) past its lease, then resumed (SIGCONT).
# Real processes on loopback, tp=2,dp=2, lease 1.5 s.
# - rank 1's agent runs with --freeze_on=persist (test-only): it stops itself, whole process,
#   the moment its write begins (on PERSIST, or once staged when its PIN said
#   write_when_staged), with its snapshot staged and nothing written;
# - the coordinator expires its lease: the save ABORTED with AGENT_LOST naming rank 1 (shown by
#   `tessera status`), nothing of the step committed or left behind;
# - SIGCONT: the agent finds its lease lapsed by its own clock and registers again, and the
#   coordinator's answer says it had given the lease up (agent/lease_keeper.h): its lease
#   generation moves on; whatever it writes of the save it was frozen in, it removes, and its
#   trainer hears the abort;
# - a later save commits with that same agent, `tessera verify` passes, and a reload is byte
#   for byte identical; every process ends within a bound.
source tests/faults/lib.sh

# Agents write once staged (PinCommand.write_when_staged): the freeze hits that path, and the
# later save below commits, verifies and reloads through it.
start_coordinator --write_when_staged=true || fail "coordinator"
start_agents "$JOB" "$LAYOUT" || fail "agents"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10 "${MODEL[@]}" || fail "first save"
[ "$(latest_step)" = "step-000000010" ] || fail "step 10 not committed"

restart_agent 1 --freeze_on=persist
victim=${AGENT_PIDS[1]}
aborts=$(count_lines "$DIR/logs/coordinator.log" "ABORTED")
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=11 "${MODEL[@]}" &
trainers=$!
wait_for_line "$DIR/logs/agent-$JOB-1.log" "fault injection: freezing on persist" 30 ||
  fail "the agent did not freeze as its write began"
waited=0
until [ "$(awk '{print $3}' "/proc/$victim/stat" 2>/dev/null)" = "T" ]; do
  [ $waited -lt 100 ] || fail "agent 1 is not stopped"
  sleep 0.1
  waited=$((waited + 1))
done
frozen_at=$(date +%s%N)
wait_aborts_beyond "$aborts" 20
grep "ABORTED" "$DIR/logs/coordinator.log" | tail -n 1 | grep -q "no heartbeat within the lease" ||
  fail "the abort is not a lease expiry: $(grep ABORTED "$DIR/logs/coordinator.log" | tail -n 1)"
expect_aborted_status frozen_agent AGENT_LOST "rank 1"
[ "$(awk '{print $3}' "/proc/$victim/stat")" = "T" ] || fail "agent 1 was not frozen throughout"
expect_not_committed 11
# Stay frozen well past the lease, then resume.
while [ $(( ($(date +%s%N) - frozen_at) / 1000000 )) -lt $((LEASE_MS * 2)) ]; do sleep 0.1; done
mark_agent_log "$JOB" 1
kill -CONT "$victim"
wait_for_line "$DIR/logs/agent-$JOB-1.log" "lease lapsed: .* may be stale: registering again" 10 ||
  fail "the resumed agent did not notice its lease had lapsed"
wait_for_line "$DIR/logs/agent-$JOB-1.log" "the coordinator gave this agent's lease up meanwhile" 10 ||
  fail "the resumed agent was not told the coordinator had given its lease up"
wait_registered "$JOB" 1 || fail "the resumed agent did not register again"
wait_pid_bounded "$trainers" "$TRAINER_TIMEOUT" "the trainers of step 11"
[ "$WAITED_RC" -ne 0 ] || fail "the save of step 11 succeeded although rank 1 was lost"
grep -q "AGENT_LOST\|lost the agent of rank 1" "$DIR/logs/trainer-$JOB-1.out" ||
  fail "trainer 1 was not told why: $(cat "$DIR/logs/trainer-$JOB-1.out")"
kill -0 "$victim" 2>/dev/null || fail "the resumed agent exited"
# Whatever the resumed agent wrote of its stale save, nothing of step 11 is left (trainer 1
# hears the abort only after its agent cleaned up).
expect_not_committed 11
ls "$DIR/ckpt/$JOB" | grep -q "step-000000011" && fail "the stale agent left files of step 11: $(ls "$DIR/ckpt/$JOB")"
echo "ok: frozen agent -> AGENT_LOST rank 1; resumed, it knew it was stale and registered again"

# The same (resumed) agent takes part in a later save: it commits, verifies, reloads exactly.
[ "${AGENT_PIDS[1]}" = "$victim" ] || fail "agent 1 was replaced"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=12 "${MODEL[@]}" ||
  fail "a save after the resumed agent came back failed"
"$CLI" verify "$(step_dir 12)" >"$DIR/logs/verify-12.out" 2>&1 ||
  fail "step 12 does not verify: $(cat "$DIR/logs/verify-12.out")"
expect_committed_status later_save 12
expect_latest_intact 12
ls "$DIR/ckpt/$JOB" | grep -q '\.tmp-' && fail "temporary directories left: $(ls "$DIR/ckpt/$JOB")"
finish
echo "PASS: an agent frozen past its lease aborts the save (AGENT_LOST), resumes stale and leaves nothing of that save behind, and a later save commits and reloads exactly"
