#!/usr/bin/env bash
# Fault matrix (issue 6): two saves of the same job overlapping (real processes on loopback,
# tp=2,dp=2). Ranks 0-2 start saving step 20; its session waits in PLANNING for rank 3. Rank
# 3's trainer then asks to save step 21: refused at once with SESSION_IN_PROGRESS naming the
# step in flight (DESIGN.md: one session per job; the planner never queues). Rank 3 then joins
# step 20, which commits, verifies and reloads; nothing of step 21 exists; `tessera status`
# shows step 20 COMMITTED. Every process ends within a bound.
source tests/faults/lib.sh

start_coordinator || fail "coordinator"
start_agents "$JOB" "$LAYOUT" || fail "agents"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10 "${MODEL[@]}" || fail "first save"

# The first save, without rank 3 yet.
TRAINER_PIDS=()
for r in 0 1 2; do
  timeout "$TRAINER_TIMEOUT" "$BIN/examples/tessera-llama-trainer" \
    --agent_socket="$SOCK_DIR/$JOB-$r.sock" --mode=save --steps=20 "${MODEL[@]}" \
    >"$DIR/logs/trainer-$JOB-$r.out" 2>&1 &
  TRAINER_PIDS+=($!)
done
first=("${TRAINER_PIDS[@]}")
waited=0
until status_json "$JOB" >"$DIR/logs/status-first.json" 2>/dev/null &&
  [ "$(status_field "$DIR/logs/status-first.json" 's["step"]')" = "20" ]; do
  [ $waited -lt 300 ] || fail "the save of step 20 did not start"
  sleep 0.1
  waited=$((waited + 1))
done
[ "$(status_field "$DIR/logs/status-first.json" 's["state"]')" = "SESSION_STATE_PLANNING" ] ||
  fail "step 20 is not waiting in PLANNING"

# The overlapping save of step 21 from rank 3.
timeout "$TRAINER_TIMEOUT" "$BIN/examples/tessera-llama-trainer" \
  --agent_socket="$SOCK_DIR/$JOB-3.sock" --mode=save --steps=21 "${MODEL[@]}" \
  --expect_error=SESSION_IN_PROGRESS >"$DIR/logs/trainer-overlap.out" 2>&1
rc=$?
[ $rc -ne 124 ] || fail "the overlapping save hung"
[ $rc -eq 0 ] || fail "the overlapping save was not refused with SESSION_IN_PROGRESS: $(cat "$DIR/logs/trainer-overlap.out")"
grep -q "is saving step 20" "$DIR/logs/trainer-overlap.out" ||
  fail "the refusal does not name the step in flight: $(cat "$DIR/logs/trainer-overlap.out")"
echo "   refused: $(sed 's/.*failed as expected: //' "$DIR/logs/trainer-overlap.out")"
status_json "$JOB" >"$DIR/logs/status-during.json" || fail "tessera status"
[ "$(status_field "$DIR/logs/status-during.json" 's["step"]')" = "20" ] &&
  [ "$(status_field "$DIR/logs/status-during.json" 's["state"]')" = "SESSION_STATE_PLANNING" ] ||
  fail "the refused save disturbed step 20: $(cat "$DIR/logs/status-during.json")"

# Rank 3 joins step 20: it commits.
timeout "$TRAINER_TIMEOUT" "$BIN/examples/tessera-llama-trainer" \
  --agent_socket="$SOCK_DIR/$JOB-3.sock" --mode=save --steps=20 "${MODEL[@]}" \
  >"$DIR/logs/trainer-$JOB-3.out" 2>&1 || fail "rank 3's save of step 20 failed"
r=0
for p in "${first[@]}"; do
  wait "$p" || fail "rank $r's save of step 20 failed: $(cat "$DIR/logs/trainer-$JOB-$r.out")"
  r=$((r + 1))
done
TRAINER_PIDS=()
"$CLI" verify "$(step_dir 20)" >"$DIR/logs/verify-20.out" 2>&1 || fail "step 20 does not verify"
expect_committed_status overlap 20
[ -e "$(step_dir 21)" ] && fail "step 21 exists"
ls "$DIR/ckpt/$JOB" | grep -q "step-000000021" && fail "files of step 21 exist"
expect_latest_intact 20
finish
echo "PASS: an overlapping save of step 21 is refused with SESSION_IN_PROGRESS naming step 20, which commits"
