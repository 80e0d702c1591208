#!/usr/bin/env bash
# End-to-end fault tests (real processes, loopback, PP1xTP2xDP2, distributed-style DP replicas):
# - an agent killed (SIGKILL) on receiving each command — pin, copy, gather, persist — aborts
#   the session with AGENT_LOST naming its rank; no checkpoint of that step appears; the
#   previous checkpoint stays the latest and still loads byte for byte; `tessera status` shows
#   the abort (AGENT_LOST and the rank);
# - trainers SIGKILLed right after Save returns: the checkpoint still commits.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
LAYOUT=tp=2,dp=2
TRAINER_TIMEOUT=60
trap stop_all EXIT
latest_step() { ls "$DIR/ckpt/job" 2>/dev/null | grep -E '^step-[0-9]+$' | sort | tail -n 1; }

start_coordinator || fail "coordinator"
start_agents job "$LAYOUT" || fail "agents"
run_trainers job "$LAYOUT" --mode=save --steps=10 --layers=2 --dim=128 || fail "first save"
[ "$(latest_step)" = "step-000000010" ] || fail "step 10 not committed"

step=10
victim=1
for phase in pin copy gather persist; do
  step=$((step + 1))
  # Restart the victim with the fault armed; the coordinator sees a new incarnation.
  stop_process "${AGENT_PIDS[$victim]}" 10
  mark_agent_log job $victim
  start_agent job "$LAYOUT" $victim --crash_on="$phase"
  wait_registered job $victim || fail "victim did not register ($phase)"
  aborts_before=$(count_lines "$DIR/logs/coordinator.log" "ABORTED")
  if run_trainers job "$LAYOUT" --mode=save --steps=$step --layers=2 --dim=128; then
    fail "the save of step $step succeeded although rank $victim died on $phase"
  fi
  wait_for_line "$DIR/logs/agent-job-$victim.log" "fault injection: crashing on $phase" 10 ||
    fail "the agent did not crash on $phase"
  # The abort is recorded with AGENT_LOST and the victim's rank.
  waited=0
  until [ "$(count_lines "$DIR/logs/coordinator.log" "ABORTED")" -gt "$aborts_before" ]; do
    sleep 0.1; waited=$((waited + 1)); [ $waited -lt 200 ] || fail "no abort after $phase"
  done
  grep "ABORTED" "$DIR/logs/coordinator.log" | tail -n 1 | grep -q "AGENT_LOST" ||
    fail "abort after crash on $phase is not AGENT_LOST: $(grep ABORTED "$DIR/logs/coordinator.log" | tail -n 1)"
  grep "ABORTED" "$DIR/logs/coordinator.log" | tail -n 1 | grep -q "rank $victim" ||
    fail "the abort does not name rank $victim"
  # ... and visible in `tessera status`: ABORTED, AGENT_LOST, naming the rank.
  "$BIN/client/cli/tessera" status --json --coordinator="127.0.0.1:$COORD_PORT" job \
    >"$DIR/logs/status-$phase.json" 2>&1 || fail "tessera status failed after a crash on $phase"
  /usr/bin/python3 - "$DIR/logs/status-$phase.json" "$step" "$victim" <<'PY' ||
import json, sys
s = json.load(open(sys.argv[1]))
e = s.get("error", {})
ranks = [r.get("rank", 0) for r in e.get("ranks", [])]
ok = (s.get("state") == "SESSION_STATE_ABORTED" and s.get("step") == sys.argv[2]
      and e.get("code") == "ERROR_CODE_AGENT_LOST" and int(sys.argv[3]) in ranks)
sys.exit(0 if ok else 1)
PY
    fail "tessera status does not show step $step ABORTED AGENT_LOST rank $victim: $(cat "$DIR/logs/status-$phase.json")"
  "$BIN/client/cli/tessera" status --coordinator="127.0.0.1:$COORD_PORT" job \
    >"$DIR/logs/status-$phase.txt" 2>&1 || fail "tessera status (table) failed after $phase"
  grep -q "aborted: AGENT_LOST" "$DIR/logs/status-$phase.txt" ||
    fail "the status table does not show AGENT_LOST after $phase"
  [ "$(latest_step)" = "step-000000010" ] || fail "latest changed after a crash on $phase"
  ls "$DIR/ckpt/job" | grep -q "step-0*$step\$" && fail "a checkpoint of step $step exists"
  # Bring the victim back healthy.
  mark_agent_log job $victim
  start_agent job "$LAYOUT" $victim
  wait_registered job $victim || fail "victim did not come back ($phase)"
  echo "ok: agent killed on $phase -> AGENT_LOST (in tessera status), step 10 still latest"
done

run_trainers job "$LAYOUT" --mode=load --load_step=-1 --layers=2 --dim=128 ||
  fail "the previous checkpoint does not load after the faults"
grep -q "loaded step 10" "$DIR/logs/trainer-job-0.out" || fail "loaded the wrong step"

# Trainers SIGKILLed right after Save returned: the agents finish the save on their own.
if run_trainers job "$LAYOUT" --mode=save --steps=30 --layers=2 --dim=128 --kill_after_save; then
  fail "the trainers were not killed"
fi
grep -q "step 30 staged" "$DIR/logs/trainer-job-0.out" || fail "the trainer died before Save returned"
wait_for_line "$DIR/logs/coordinator.log" "COMMITTED step 30" 30 ||
  fail "step 30 did not commit after its trainers exited"
run_trainers job "$LAYOUT" --mode=load --load_step=30 --layers=2 --dim=128 ||
  fail "step 30 does not load"
# Saved before the first optimizer step (state declared absent), loaded by a trainer that
# has an optimizer: the absent states are reported, never a KeyError-style failure.
run_trainers job "$LAYOUT" --mode=save --steps=40 --layers=2 --dim=128 --optimizer=absent ||
  fail "saving with absent optimizer state"
run_trainers job "$LAYOUT" --mode=load --load_step=40 --layers=2 --dim=128 ||
  fail "loading a checkpoint with absent optimizer state"
grep -q "optimizer states or extras absent in the checkpoint" "$DIR/logs/trainer-job-0.out" ||
  fail "the absent optimizer state was not reported on load"

echo "PASS: agent crash in pin/copy/gather/persist aborts with AGENT_LOST and keeps the latest; trainer kill -9 after Save still commits; absent optimizer state saves and loads"
