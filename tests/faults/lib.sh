# Shared helpers of the fault-matrix tests (source it from the test's runfiles directory).
# Real processes on loopback through deploy/lib/cluster.sh; every wait is bounded and every
# process the test starts is stopped on exit (trap stop_all EXIT, set here).
#
# Each fault case asserts the matrix's four promises (issue 6):
#   - no committed incomplete checkpoint: no step directory of the failed save, and
#     `tessera verify` passes on every committed one;
#   - the previous latest stays latest and loads byte for byte (trainers in --mode=load check
#     every byte);
#   - the abort reason is visible in `tessera status` (code, and the rank or path it names);
#   - every process ends within a bound (trainers run under `timeout`; a 124/137 exit is a
#     hang, and agents and coordinator must exit on SIGTERM within 10 s).
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
CLI="$BIN/client/cli/tessera"
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=${LEASE_MS:-1500}
LAYOUT=${LAYOUT:-tp=2,dp=2}
# Unique per run: staging regions in /dev/shm are named after the job and rank, and an agent
# removes its rank's regions of earlier agents when it starts, so two runs on one host must
# not share a job id.
JOB=${JOB:-f$$}
TRAINER_TIMEOUT=${TRAINER_TIMEOUT:-60}
MODEL=(--layers=2 --dim=128)
# Per-process bound for the trainers; the test fails if one had to be killed by it.
trap stop_all EXIT

# cli_coordinator: the address the checks' CLI dials — the coordinator itself, never a proxy
# the agents may dial through. A test on several hosts (tests/hosts/) redefines it, and points
# CLI at a command that runs the CLI on the coordinator's host.
cli_coordinator() { echo "127.0.0.1:$COORD_PORT"; }

step_dir() { echo "$DIR/ckpt/$JOB/step-$(printf %09d "$1")"; }
latest_step() { ls "$DIR/ckpt/$JOB" 2>/dev/null | grep -E '^step-[0-9]+$' | sort | tail -n 1; }

# run_trainers_bounded JOB LAYOUT FLAGS...: run_trainers, but a trainer that ran into
# TRAINER_TIMEOUT (exit 124, or 137 after SIGKILL) fails the test: a hang, not an error.
# Returns 0 if every trainer exited 0, else 1.
run_trainers_bounded() {
  local job=$1 layout=$2; shift 2
  local n r p rc=0 code
  n=$(world_size "$layout")
  TRAINER_PIDS=()
  for r in $(seq 0 $((n - 1))); do
    place_rank "$r"
    "${PLACE_WRAP[@]}" timeout "$TRAINER_TIMEOUT" "$BIN/examples/tessera-llama-trainer" \
      --agent_socket="$SOCK_DIR/$job-$r.sock" "$@" >"$DIR/logs/trainer-$job-$r.out" 2>&1 &
    TRAINER_PIDS+=($!)
  done
  r=0
  for p in "${TRAINER_PIDS[@]}"; do
    wait "$p"
    code=$?
    [ "$code" -eq 124 ] && fail "trainer $r hung: killed after ${TRAINER_TIMEOUT}s"
    [ "$code" -eq 0 ] || rc=1
    r=$((r + 1))
  done
  TRAINER_PIDS=()
  return $rc
}

# wait_pid_bounded PID TIMEOUT_S WHAT: waits for a child to exit on its own; fails the test if
# it is still running after TIMEOUT_S. Sets WAITED_RC to its exit status.
wait_pid_bounded() {
  local pid=$1 timeout=$2 what=$3 waited=0
  while kill -0 "$pid" 2>/dev/null; do
    [ "$waited" -lt $((timeout * 10)) ] || fail "$what did not end within ${timeout}s"
    sleep 0.1
    waited=$((waited + 1))
  done
  wait "$pid" 2>/dev/null
  WAITED_RC=$?
}

# status_json JOB [SESSION]: `tessera status --json` of the job's current, else latest, save.
status_json() {
  "$CLI" status --json --coordinator="$(cli_coordinator)" --timeout_ms=5000 \
    ${2:+--session="$2"} "$1"
}

# status_field JSON_FILE EXPR: a field of a SessionStatus JSON document, by a Python
# expression over `s` (the parsed document); empty if absent.
status_field() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
try:
    v = eval(sys.argv[2], {"s": s})
except (KeyError, IndexError, TypeError):
    v = ""
print(v if not isinstance(v, (list, dict)) else json.dumps(v))
PY
}

# expect_aborted_status CASE CODE REGEX: `tessera status` (JSON and the human table) shows the
# job's latest save ABORTED with error code CODE, and REGEX matches what the error names (its
# message, ranks and path). Leaves the JSON in $DIR/logs/status-CASE.json.
expect_aborted_status() {
  local name=$1 code=$2 regex=$3 json="$DIR/logs/status-$1.json" human="$DIR/logs/status-$1.txt"
  status_json "$JOB" >"$json" 2>"$DIR/logs/status-$name.err" ||
    fail "$name: tessera status failed: $(cat "$DIR/logs/status-$name.err")"
  local state got names
  state=$(status_field "$json" 's["state"]')
  got=$(status_field "$json" 's["error"]["code"]')
  names=$(status_field "$json" \
    '" ".join([s["error"].get("message", ""), s["error"].get("path", "")] + ["rank %d" % r.get("rank", 0) for r in s["error"].get("ranks", [])])')
  [ "$state" = "SESSION_STATE_ABORTED" ] || fail "$name: tessera status shows $state, not ABORTED"
  [ "$got" = "ERROR_CODE_$code" ] || fail "$name: tessera status shows error $got, not $code"
  echo "$names" | grep -Eq -- "$regex" ||
    fail "$name: the error in tessera status does not name /$regex/: $names"
  "$CLI" status --coordinator="$(cli_coordinator)" --timeout_ms=5000 "$JOB" >"$human" 2>&1 ||
    fail "$name: tessera status (table) failed"
  grep -q "aborted: $code" "$human" || fail "$name: the status table does not show '$code'"
  echo "   tessera status: ABORTED $code: $(status_field "$json" 's["error"]["message"]')"
}

# expect_committed_status CASE STEP: `tessera status` shows the latest save COMMITTED at STEP.
expect_committed_status() {
  local name=$1 json="$DIR/logs/status-$1.json"
  status_json "$JOB" >"$json" 2>&1 || fail "$name: tessera status failed"
  [ "$(status_field "$json" 's["state"]')" = "SESSION_STATE_COMMITTED" ] ||
    fail "$name: tessera status does not show COMMITTED: $(cat "$json")"
  [ "$(status_field "$json" 's["step"]')" = "$2" ] ||
    fail "$name: tessera status shows step $(status_field "$json" 's["step"]'), not $2"
}

# wait_aborts_beyond N TIMEOUT_S: waits until the coordinator logged more than N aborts.
wait_aborts_beyond() {
  local n=$1 timeout=$2 waited=0
  until [ "$(count_lines "$DIR/logs/coordinator.log" "ABORTED")" -gt "$n" ]; do
    [ "$waited" -lt $((timeout * 10)) ] || fail "no abort within ${timeout}s"
    sleep 0.1
    waited=$((waited + 1))
  done
}

# expect_not_committed STEP: no directory of STEP under its final name, and within 10 s no
# temporary directory of it is left either (the coordinator garbage-collects it).
expect_not_committed() {
  local dir waited=0
  dir=$(step_dir "$1")
  [ -e "$dir" ] && fail "step $1 failed but $dir exists"
  while ls "$DIR/ckpt/$JOB" 2>/dev/null | grep -q "^$(basename "$dir")\.tmp-"; do
    [ "$waited" -lt 100 ] || fail "a temporary directory of step $1 is left: $(ls "$DIR/ckpt/$JOB")"
    sleep 0.1
    waited=$((waited + 1))
  done
  "$CLI" checkpoints --json --coordinator="$(cli_coordinator)" "$JOB" 2>/dev/null |
    grep -q "\"step\": *\"\?$1\"\?," && fail "step $1 is listed as a checkpoint"
  return 0
}

# expect_latest_intact STEP: STEP is still the latest committed step, verifies, and the
# trainers load it byte for byte.
expect_latest_intact() {
  [ "$(latest_step)" = "$(basename "$(step_dir "$1")")" ] ||
    fail "latest is $(latest_step), not step $1"
  "$CLI" verify "$(step_dir "$1")" >"$DIR/logs/verify-$1.out" 2>&1 ||
    fail "step $1 does not verify: $(cat "$DIR/logs/verify-$1.out")"
  run_trainers_bounded "$JOB" "$LAYOUT" --mode=load --load_step=-1 "${MODEL[@]}" ||
    fail "the latest checkpoint (step $1) does not load"
  grep -q "loaded step $1 " "$DIR/logs/trainer-$JOB-0.out" || fail "loaded the wrong step"
}

# restart_agent RANK [FLAGS...]: SIGTERM the rank's agent (it must exit within 10 s, unless it
# is already gone), start a new one with FLAGS, and wait until it registered.
restart_agent() {
  local r=$1; shift
  if kill -0 "${AGENT_PIDS[$r]}" 2>/dev/null; then
    stop_process "${AGENT_PIDS[$r]}" 10
    [ $? -ne 124 ] || fail "agent $r did not stop within 10 s"
  else
    wait "${AGENT_PIDS[$r]}" 2>/dev/null
  fi
  mark_agent_log "$JOB" "$r"
  start_agent "$JOB" "$LAYOUT" "$r" "$@"
  wait_registered "$JOB" "$r" || fail "agent $r did not register"
}

# restart_coordinator [FLAGS...]: SIGTERM the coordinator (it must exit 0 within 10 s), start
# it again on the same RocksDB and port with COORD_FLAGS (if set) and FLAGS, and wait until
# every agent of LAYOUT registered with it.
restart_coordinator() {
  local r world
  world=$(world_size "$LAYOUT")
  if [ -n "$COORD_PID" ]; then stop_coordinator || fail "the coordinator did not stop cleanly"; fi
  for r in $(seq 0 $((world - 1))); do mark_agent_log "$JOB" "$r"; done
  start_coordinator ${COORD_FLAGS[@]+"${COORD_FLAGS[@]}"} "$@" || fail "coordinator restart"
  for r in $(seq 0 $((world - 1))); do
    wait_registered "$JOB" "$r" || fail "agent $r did not register again"
  done
}

# finish: every agent and the coordinator exit 0 on SIGTERM within 10 s.
finish() {
  local r
  for r in "${!AGENT_PIDS[@]}"; do
    stop_process "${AGENT_PIDS[$r]}" 10 || fail "agent $r did not exit cleanly on SIGTERM"
  done
  AGENT_PIDS=()
  stop_coordinator || fail "the coordinator did not exit cleanly on SIGTERM"
}

# agent_logs: every agent log of the job, concatenated.
agent_logs() { cat "$DIR"/logs/agent-"$JOB"-*.log 2>/dev/null; }
# agent_lines_above REGEX N: true once the agents' logs hold more than N lines matching REGEX.
agent_lines_above() { [ "$(agent_logs | grep -Ec -- "$1")" -gt "$2" ]; }

# start_save STEP [FLAGS...]: every rank's trainer saves STEP in the background, under
# TRAINER_TIMEOUT (pids in TRAINER_PIDS[rank]); wait for each with wait_trainer.
start_save() {
  local step=$1 r n
  shift
  n=$(world_size "$LAYOUT")
  TRAINER_PIDS=()
  for r in $(seq 0 $((n - 1))); do
    place_rank "$r"
    "${PLACE_WRAP[@]}" timeout "$TRAINER_TIMEOUT" "$BIN/examples/tessera-llama-trainer" \
      --agent_socket="$SOCK_DIR/$JOB-$r.sock" --mode=save --steps="$step" "${MODEL[@]}" "$@" \
      >"$DIR/logs/trainer-$JOB-$r.out" 2>&1 &
    TRAINER_PIDS[$r]=$!
  done
}

# wait_trainer RANK WHAT: waits (bounded) for RANK's trainer of start_save; fails the test
# unless it exited 0.
wait_trainer() {
  wait_pid_bounded "${TRAINER_PIDS[$1]}" "$TRAINER_TIMEOUT" "trainer $1"
  [ "$WAITED_RC" -eq 0 ] ||
    fail "$2: trainer $1 exited $WAITED_RC: $(tail -n 3 "$DIR/logs/trainer-$JOB-$1.out")"
}
