#!/usr/bin/env bash
# Bounded soak (real processes on loopback): one coordinator (RocksDB) and the agents of a
# tp=2,dp=2 job saving a small llama-like model (--layers=2 --dim=128, distributed optimizer)
# many times, at increasing steps. Each round draws one fault from a seeded RNG:
#   none          a plain save;                              must commit
#   agent_kill    a random agent SIGKILLs itself on receiving a random command (--crash_on:
#                 pin, copy, gather, persist);              must abort with a reason if it died
#   coord_kill    the coordinator SIGKILLs itself right after persisting a random state
#                 (--crash_in_state), then restarts on the same RocksDB and port
#   trainer_kill  every trainer SIGKILLs itself right after Save returns; must still commit
#   agent_stop    a random agent is SIGSTOPped at a random moment of the save until the
#                 coordinator lists it as not alive (its lease expired), then SIGCONTed
#   storage_fault only if tessera-agent has --inject_storage_fault: a random agent's storage
#                 fails (EIO, ENOSPC or EDQUOT on the Nth write, after N bytes or on fsync; or
#                 a read-only root); aborts with a reason, or commits if the agent wrote
#                 nothing that failed
# Whatever was killed is restarted. After EVERY round these invariants are checked:
#   - every committed checkpoint (`tessera checkpoints`) has its directory and passes
#     `tessera verify` (checksums included);
#   - no step-N directory exists that is not committed and verified (aborted leftovers never
#     look like checkpoints), no temporary directory outlives its session, and a step the
#     soak saw abort is never listed;
#   - `latest` (the job's latest committed step, the listing's newest, the newest directory)
#     is the newest step that ever committed;
#   - the round's outcome agrees with the trainers (all succeeded => committed), an aborted
#     save has a reason in `tessera status`, and the faults that must not abort a save did not;
#   - every process ends within a bound (trainers run under `timeout`; rc 124 is a hang).
# Every SOAK_LOAD_EVERY rounds and at the end, `latest` is loaded by a fresh set of trainers
# and checked byte for byte. The last line is a one-line count summary; exit 1 if any
# invariant broke (the failing round and the seed are printed: rerun with that seed).
#
# Knobs (environment, or the flags --seed=N --minutes=M --rounds=N):
#   SOAK_SEED        RNG seed (default: derived from the clock; always printed)
#   SOAK_MINUTES     run rounds for about this many minutes (default: the suite's bound, ~30 s
#                    of rounds: a new seed every run, so CI covers more seeds over time)
#   SOAK_ROUNDS      at most this many rounds (default 15 in the suite, unlimited with
#                    SOAK_MINUTES)
#   SOAK_KEEP_LAST   coordinator --keep_last (default 5, so retention runs under faults too)
#   SOAK_LOAD_EVERY  reload latest every N rounds (default 3)
#   SOAK_COORD_STATES  states coord_kill picks from (default PLANNING PINNING COPYING
#                    PERSISTING COMMITTING COMMITTED)
#   SOAK_PLANNING_TIMEOUT_S  coordinator --planning_timeout_s (default 8; see COORD_FLAGS)
# A seed replays the same faults only with the same set of kinds (storage_fault is included
# only when the agent has the flag).
# Longer runs:
#   SOAK_MINUTES=30 bazel run //tests/soak:soak_test
#   bazel run //tests/soak:soak_test -- --minutes=30 --seed=1234
#   bazel test //tests/soak:soak_test --test_env=SOAK_MINUTES=30 --test_timeout=2100
#   (direct, from the repository root after a build:
#    BIN=bazel-bin SOAK_MINUTES=30 tests/soak/soak_test.sh)
set -uo pipefail
for arg in "$@"; do
  case "$arg" in
    --seed=*) SOAK_SEED=${arg#*=} ;;
    --minutes=*) SOAK_MINUTES=${arg#*=} ;;
    --rounds=*) SOAK_ROUNDS=${arg#*=} ;;
    *) echo "usage: $0 [--seed=N] [--minutes=M] [--rounds=N]" >&2; exit 2 ;;
  esac
done
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=${BIN:-.}
DIR=${TEST_TMPDIR:-$(mktemp -d)}/soak
SOAK_SEED=${SOAK_SEED:-$(( $(date +%s%N) % 1000000007 ))}
if [ -n "${SOAK_MINUTES:-}" ]; then
  BUDGET_S=$((SOAK_MINUTES * 60 - 20))
  MAX_ROUNDS=${SOAK_ROUNDS:-1000000}
else
  BUDGET_S=30
  MAX_ROUNDS=${SOAK_ROUNDS:-15}
fi
KEEP_LAST=${SOAK_KEEP_LAST:-5}
LOAD_EVERY=${SOAK_LOAD_EVERY:-3}
LEASE_MS=1500
LAYOUT=tp=2,dp=2
WORLD=4
# A job id of its own: agents remove the staging regions (/dev/shm/tessera-<job>-r<rank>-*) of
# any other agent of the same job id and rank on the host, even one of another cluster.
JOB=soak-$$
TRAINER_TIMEOUT=60
MODEL=(--layers=2 --dim=128 --optimizer=distributed)
# A rank frozen past its lease before its plan reached the coordinator submits that plan when
# it resumes, after the session aborted: the coordinator opens a second session of the same
# step that only that rank joins ("re-opened sessions" in the summary). The next round's save
# supersedes it (SUPERSEDED); the short planning timeout (SOAK_PLANNING_TIMEOUT_S) only bounds
# a late plan of the last round.
COORD_FLAGS=(--keep_last="$KEEP_LAST" --planning_timeout_s="${SOAK_PLANNING_TIMEOUT_S:-8}")
AGENT_COMMANDS=(pin copy gather persist)  # the coordinator commits itself: no agent gets "commit"
# COMMITTED included: the restarted coordinator replays the ended session's outcome to the
# agents that reconnect (JobRecord.last_session_id), so trainers waiting for it are told.
read -ra COORD_STATES <<<"${SOAK_COORD_STATES:-PLANNING PINNING COPYING PERSISTING COMMITTING COMMITTED}"
PY=/usr/bin/python3
STATE_PY=tests/soak/soak_state.py
mkdir -p "$DIR/logs" "$DIR/state"

# --- bookkeeping ---------------------------------------------------------------------------
ROUND=0
STEP=0
KIND=-
declare -A FAULTS=() REASONS=() EVER_COMMITTED=() SEEN_ABORTED=() LEFTOVER_SINCE=()
COMMITTED=0
ABORTED=0
NOT_STARTED=0
AGENT_CRASHED=0
VERIFY_RUN=0
VERIFY_PASS=0
LOAD_RUN=0
LOAD_PASS=0
RETENTION_DEFERRED=0
ORPHANS=0
NEWEST_COMMITTED=-1
START_S=$SECONDS

say() { echo "[soak +$((SECONDS - START_S))s] $*"; }

summary() {
  local verdict=$1 faults="" reasons="" k
  for k in none agent_kill coord_kill trainer_kill agent_stop storage_fault; do
    [ -n "${FAULTS[$k]:-}" ] && faults+="$k=${FAULTS[$k]} "
  done
  for k in $(printf '%s\n' "${!REASONS[@]}" | sort); do reasons+="$k=${REASONS[$k]},"; done
  echo "SOAK SUMMARY: seed=$SOAK_SEED rounds=$ROUND faults: ${faults% }" \
    "(agents that crashed=$AGENT_CRASHED); saves: committed=$COMMITTED aborted=$ABORTED" \
    "(${reasons%,}) not_started=$NOT_STARTED; verifications run=$VERIFY_RUN passed=$VERIFY_PASS;" \
    "latest reloads run=$LOAD_RUN passed=$LOAD_PASS; retention deferred=$RETENTION_DEFERRED;" \
    "re-opened sessions=$ORPHANS;" \
    "wall=$((SECONDS - START_S))s; invariants: $verdict"
}

cleanup() {
  local p
  for p in "${AGENT_PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
  stop_all
}
trap cleanup EXIT

fail() {
  echo "FAIL (seed $SOAK_SEED, round $ROUND, step $STEP, fault $KIND: ${DETAIL:--}): $*"
  tail -n 5 "$DIR"/logs/trainer-*.out "$DIR"/logs/agent-*.log 2>/dev/null
  tail -n 20 "$DIR/logs/coordinator.log" 2>/dev/null
  summary "BROKEN (round $ROUND: $*)"
  exit 1
}

# draw N: DRAW = a seeded random number in [0, N). Always called in the main shell.
draw() { DRAW=$((RANDOM % $1)); }

cli() { "$BIN/client/cli/tessera" --coordinator="127.0.0.1:$COORD_PORT" --timeout_ms=5000 "$@"; }

# job_state: LATEST CURRENT ALIVE from `tessera jobs --json` (returns 1 if unreachable).
job_state() {
  cli jobs --json >"$DIR/state/jobs.json" 2>"$DIR/state/jobs.err" || return 1
  read -r LATEST CURRENT ALIVE < <("$PY" "$STATE_PY" job "$DIR/state/jobs.json" "$JOB")
}

# session_state: S_STEP S_STATE S_CODE S_MSG of the job's current, else latest, session.
session_state() {
  S_STEP=-1 S_STATE=- S_CODE=- S_MSG=
  cli status "$JOB" --json >"$DIR/state/status.json" 2>"$DIR/state/status.err" || return 1
  read -r S_STEP S_STATE S_CODE S_MSG < <("$PY" "$STATE_PY" session "$DIR/state/status.json")
}

dead_ranks() {
  cli agents "$JOB" --json >"$DIR/state/agents.json" 2>/dev/null || { echo "?"; return; }
  "$PY" "$STATE_PY" dead "$DIR/state/agents.json"
}

# ensure_ready: every agent alive, registered and no save in flight (bounded).
ensure_ready() {
  local waited=0 r
  while true; do
    for r in $(seq 0 $((WORLD - 1))); do
      kill -0 "${AGENT_PIDS[$r]}" 2>/dev/null || fail "agent $r is not running before round $ROUND"
    done
    if job_state && [ "$CURRENT" = - ] && [ "$ALIVE" = "$WORLD" ] && [ -z "$(dead_ranks)" ]; then
      return 0
    fi
    sleep 0.2
    waited=$((waited + 1))
    [ $waited -lt 300 ] ||
      fail "the cluster is not ready after 60 s (alive=${ALIVE:-?} current=${CURRENT:-?})"
  done
}

# start_trainers ARGS...: one trainer per rank in the background, bounded by `timeout`.
start_trainers() {
  local r
  TRAINER_PIDS=()
  for r in $(seq 0 $((WORLD - 1))); do
    # The subshell turns a death by signal into an exit status; its "Killed" notice is dropped.
    (timeout -k 5 "$TRAINER_TIMEOUT" "$BIN/examples/tessera-llama-trainer" \
      --agent_socket="$SOCK_DIR/$JOB-$r.sock" "$@" >"$DIR/logs/trainer-$r.out" 2>&1; exit $?) 2>/dev/null &
    TRAINER_PIDS+=($!)
  done
}
# wait_trainers: TRAINER_RCS, TRAINERS_OK (1 if all exited 0); a timed-out trainer is a hang.
wait_trainers() {
  local p r=0 rc
  TRAINER_RCS=()
  TRAINERS_OK=1
  for p in "${TRAINER_PIDS[@]}"; do
    wait "$p"
    rc=$?
    TRAINER_RCS+=("$rc")
    [ "$rc" -eq 0 ] || TRAINERS_OK=0
    { echo "== round $ROUND rank $r rc $rc"; cat "$DIR/logs/trainer-$r.out"; } \
      >>"$DIR/logs/trainers-all.out"
    r=$((r + 1))
  done
  TRAINER_PIDS=()
  for rc in "${TRAINER_RCS[@]}"; do
    [ "$rc" -ne 124 ] || fail "a trainer hung (killed by timeout after ${TRAINER_TIMEOUT}s)"
  done
}

restart_agent() {  # RANK [flags...]: stops (or reaps) the agent and starts it again
  local r=$1 rc alive=0; shift
  kill -0 "${AGENT_PIDS[$r]}" 2>/dev/null && alive=1
  stop_process "${AGENT_PIDS[$r]}" 10
  rc=$?
  [ $rc -ne 124 ] || fail "agent $r did not exit within 10 s of SIGTERM"
  [ $alive -eq 0 ] || [ $rc -eq 0 ] ||
    fail "agent $r exited with status $rc on SIGTERM: $(tail -n 2 "$DIR/logs/agent-$JOB-$r.log" | tr '\n' ' ')"
  mark_agent_log "$JOB" "$r"
  start_agent "$JOB" "$LAYOUT" "$r" "$@"
  wait_registered "$JOB" "$r" || fail "agent $r did not register after a restart"
}

# await_outcome: OUTCOME committed | aborted | not_started for $STEP, with REASON (bounded).
await_outcome() {
  local waited=0
  OUTCOME= REASON=-
  while true; do
    if session_state && job_state; then
      if [ "$S_STEP" = "$STEP" ] && [ "$S_STATE" = SESSION_STATE_COMMITTED ]; then
        OUTCOME=committed
        return
      elif [ "$S_STEP" = "$STEP" ] && [ "$S_STATE" = SESSION_STATE_ABORTED ]; then
        OUTCOME=aborted
        REASON=${S_CODE#ERROR_CODE_}
        return
      elif [ "$CURRENT" = - ] && [ "$S_STEP" -lt "$STEP" ]; then
        OUTCOME=not_started
        return
      fi
    fi
    sleep 0.2
    waited=$((waited + 1))
    [ $waited -lt 450 ] ||
      fail "the save of step $STEP did not end within 90 s (status: $S_STEP $S_STATE $S_CODE)"
  done
}

step_dirs() { ls "$DIR/ckpt/$JOB" 2>/dev/null | grep -E '^step-[0-9]+$'; }
tmp_dirs() { ls "$DIR/ckpt/$JOB" 2>/dev/null | grep -F '.tmp-'; }
step_of() { echo $((10#${1#step-})); }

# check_invariants: after every round (see the header).
check_invariants() {
  local waited=0 listed=() listed_dirs=() line s d extra newest_dir=-1 min_listed
  declare -A in_list=()
  # Let the coordinator finish its retention and temporary-directory removal (bounded).
  while true; do
    cli checkpoints "$JOB" --json >"$DIR/state/checkpoints.json" 2>"$DIR/state/checkpoints.err" ||
      fail "tessera checkpoints failed: $(cat "$DIR/state/checkpoints.err")"
    listed=() listed_dirs=() in_list=()
    while read -r s d; do
      [ -n "$s" ] || continue
      listed+=("$s")
      listed_dirs+=("$d")
      in_list[$s]=1
    done < <("$PY" "$STATE_PY" checkpoints "$DIR/state/checkpoints.json")
    extra=0
    for d in $(step_dirs); do [ -n "${in_list[$(step_of "$d")]:-}" ] || extra=1; done
    if [ $extra -eq 0 ] && [ -z "$(tmp_dirs)" ]; then break; fi
    sleep 0.2
    waited=$((waited + 1))
    [ $waited -lt 50 ] || break
  done
  [ -z "$(tmp_dirs)" ] ||
    fail "temporary directories remain with no save in flight: $(tmp_dirs | tr '\n' ' ')"
  [ "${#listed[@]}" -le "$KEEP_LAST" ] || [ "$KEEP_LAST" -eq 0 ] ||
    fail "${#listed[@]} checkpoints listed with --keep_last=$KEEP_LAST"
  # Every listed checkpoint exists and verifies.
  local i
  for i in "${!listed[@]}"; do
    s=${listed[$i]}
    d=${listed_dirs[$i]}
    [ "$d" = "$DIR/ckpt/$JOB/step-$(printf %09d "$s")" ] || fail "step $s is listed with dir $d"
    [ -f "$d/manifest.pb" ] || fail "committed step $s has no manifest in $d"
    [ -z "${SEEN_ABORTED[$s]:-}" ] || fail "step $s aborted (${SEEN_ABORTED[$s]}) but is listed"
    VERIFY_RUN=$((VERIFY_RUN + 1))
    "$BIN/client/cli/tessera" verify "$d" >"$DIR/logs/verify.out" 2>&1 ||
      fail "committed step $s does not verify: $(head -n 5 "$DIR/logs/verify.out")"
    VERIFY_PASS=$((VERIFY_PASS + 1))
    EVER_COMMITTED[$s]=1
    [ "$s" -le "$NEWEST_COMMITTED" ] || NEWEST_COMMITTED=$s
  done
  # Every step directory is a listed checkpoint, or an older one whose removal by retention
  # was deferred (a coordinator killed between recording a commit and collecting) until the
  # next commit.
  LISTED_COUNT=${#listed[@]}
  min_listed=0
  [ "$LISTED_COUNT" -eq 0 ] || min_listed=${listed[$((LISTED_COUNT - 1))]}
  for d in $(step_dirs); do
    s=$(step_of "$d")
    [ "$s" -le "$newest_dir" ] || newest_dir=$s
    [ -n "${in_list[$s]:-}" ] && continue
    [ -n "${EVER_COMMITTED[$s]:-}" ] ||
      fail "step directory $d exists but step $s was never committed (manifest: $(ls "$DIR/ckpt/$JOB/$d" | tr '\n' ' '))"
    [ "$s" -lt "$min_listed" ] || fail "committed step $s is on disk but not listed"
    if [ -z "${LEFTOVER_SINCE[$s]:-}" ]; then
      LEFTOVER_SINCE[$s]=$COMMITTED
      RETENTION_DEFERRED=$((RETENTION_DEFERRED + 1))
      say "note: step $s is beyond --keep_last=$KEEP_LAST but still on disk (retention deferred)"
    elif [ "$COMMITTED" -gt "${LEFTOVER_SINCE[$s]}" ]; then
      fail "step $s is beyond --keep_last=$KEEP_LAST and survived a later commit's retention"
    fi
  done
  # latest: the job record, the listing and the newest directory agree with the soak.
  job_state || fail "tessera jobs failed: $(cat "$DIR/state/jobs.err")"
  [ "$LATEST" = "$NEWEST_COMMITTED" ] ||
    fail "the job's latest committed step is $LATEST, the newest committed is $NEWEST_COMMITTED"
  [ "${listed[0]:--1}" = "$NEWEST_COMMITTED" ] ||
    fail "the newest listed checkpoint is ${listed[0]:-none}, expected $NEWEST_COMMITTED"
  [ "$newest_dir" = "$NEWEST_COMMITTED" ] ||
    fail "the newest step directory is $newest_dir, expected $NEWEST_COMMITTED"
}

# reload_latest: trainers load `latest` and check every byte.
reload_latest() {
  [ "$NEWEST_COMMITTED" -ge 0 ] || return 0
  LOAD_RUN=$((LOAD_RUN + 1))
  start_trainers --mode=load --load_step=-1 "${MODEL[@]}"
  wait_trainers
  [ $TRAINERS_OK -eq 1 ] ||
    fail "loading latest failed (rcs ${TRAINER_RCS[*]}): $(grep -h tessera-llama-trainer "$DIR"/logs/trainer-*.out | head -n 2)"
  local r
  for r in $(seq 0 $((WORLD - 1))); do
    grep -q "loaded step $NEWEST_COMMITTED " "$DIR/logs/trainer-$r.out" ||
      fail "rank $r did not load step $NEWEST_COMMITTED: $(cat "$DIR/logs/trainer-$r.out")"
  done
  LOAD_PASS=$((LOAD_PASS + 1))
}

# --- the faults ----------------------------------------------------------------------------
save_args() { echo --mode=save --steps="$STEP" "${MODEL[@]}"; }

fault_none() {
  DETAIL="plain save"
  start_trainers $(save_args)
  wait_trainers
}

fault_trainer_kill() {
  DETAIL="all trainers SIGKILL after Save returns"
  start_trainers $(save_args) --kill_after_save
  wait_trainers
  local r
  for r in $(seq 0 $((WORLD - 1))); do
    grep -q "step $STEP staged" "$DIR/logs/trainer-$r.out" ||
      fail "trainer $r died before its Save returned: $(cat "$DIR/logs/trainer-$r.out")"
    [ "${TRAINER_RCS[$r]}" -eq 137 ] || fail "trainer $r was not killed (rc ${TRAINER_RCS[$r]})"
  done
}

fault_agent_kill() {
  local v=$VICTIM cmd=${AGENT_COMMANDS[$((PICK % ${#AGENT_COMMANDS[@]}))]} before
  local log="$DIR/logs/agent-$JOB-$v.log"
  restart_agent "$v" --crash_on="$cmd"
  before=$(count_lines "$log" "fault injection: crashing on")
  start_trainers $(save_args)
  wait_trainers
  CRASHED=0
  if [ "$(count_lines "$log" "fault injection: crashing on")" -gt "$before" ]; then
    CRASHED=1
    AGENT_CRASHED=$((AGENT_CRASHED + 1))
    kill -0 "${AGENT_PIDS[$v]}" 2>/dev/null && fail "agent $v logged its crash but is alive"
  fi
  DETAIL="agent $v --crash_on=$cmd ($([ $CRASHED -eq 1 ] && echo crashed || echo "not reached"))"
  restart_agent "$v"
}

fault_coord_kill() {
  local state=${COORD_STATES[$((PICK % ${#COORD_STATES[@]}))]} r waited=0
  DETAIL="coordinator --crash_in_state=$state"
  stop_coordinator || fail "the coordinator did not stop cleanly before arming $state"
  for r in $(seq 0 $((WORLD - 1))); do mark_agent_log "$JOB" "$r"; done
  start_coordinator "${COORD_FLAGS[@]}" --crash_in_state="$state" ||
    fail "the coordinator (armed for $state) did not start"
  for r in $(seq 0 $((WORLD - 1))); do
    wait_registered "$JOB" "$r" || fail "agent $r did not re-register with the armed coordinator"
  done
  local crashes_before
  crashes_before=$(count_lines "$DIR/logs/coordinator.log" "fault injection: crashing in")
  start_trainers $(save_args)
  until [ "$(count_lines "$DIR/logs/coordinator.log" "fault injection: crashing in")" -gt "$crashes_before" ]; do
    sleep 0.1
    waited=$((waited + 1))
    [ $waited -lt 600 ] || fail "the coordinator did not crash in $state within 60 s"
  done
  local waited_exit=0
  while kill -0 "$COORD_PID" 2>/dev/null; do
    sleep 0.1
    waited_exit=$((waited_exit + 1))
    [ $waited_exit -lt 100 ] || fail "the coordinator logged its crash but is still running"
  done
  wait "$COORD_PID" 2>/dev/null
  COORD_PID=""
  start_coordinator "${COORD_FLAGS[@]}" || fail "the coordinator did not restart after $state"
  wait_trainers
}

fault_agent_stop() {
  local v=$VICTIM delay_ms=$((PICK % 1200)) waited=0 bound
  DETAIL="agent $v SIGSTOP ${delay_ms} ms into the save, past its lease, then SIGCONT"
  start_trainers $(save_args)
  sleep "$((delay_ms / 1000)).$(printf %03d $((delay_ms % 1000)))"  # when to freeze: the fault
  kill -STOP "${AGENT_PIDS[$v]}" || fail "cannot SIGSTOP agent $v"
  bound=$(( (LEASE_MS * 4 + 10000) / 200 ))
  until dead_ranks | grep -qw "$v"; do
    sleep 0.2
    waited=$((waited + 1))
    if [ $waited -ge $bound ]; then
      kill -CONT "${AGENT_PIDS[$v]}"
      fail "agent $v was frozen for $((bound / 5)) s but the coordinator still lists it alive"
    fi
  done
  kill -CONT "${AGENT_PIDS[$v]}" || fail "cannot SIGCONT agent $v"
  wait_trainers
  waited=0
  until [ -z "$(dead_ranks)" ]; do
    sleep 0.2
    waited=$((waited + 1))
    [ $waited -lt 150 ] || fail "agent $v did not come back alive within 30 s of SIGCONT"
  done
}

STORAGE_FAULT_FLAG=""
AGENT_HELP=$("$BIN/agent/tessera-agent" --help 2>&1)  # exits 1 after printing the usage
if grep -q -- "--inject_storage_fault" <<<"$AGENT_HELP"; then
  STORAGE_FAULT_FLAG=--inject_storage_fault
fi
STORAGE_ERRORS=(eio enospc edquot)
fault_storage_fault() {
  local v=$VICTIM err=${STORAGE_ERRORS[$((PICK % 3))]} spec
  case $(((PICK / 3) % 4)) in
    0) spec="$err:write=$((1 + (PICK / 12) % 4))" ;;
    1) spec="$err:after_bytes=$(((PICK / 12) % 1048576))" ;;
    2) spec="$err:sync" ;;
    3) spec=readonly ;;
  esac
  DETAIL="agent $v $STORAGE_FAULT_FLAG=$spec"
  restart_agent "$v" "$STORAGE_FAULT_FLAG=$spec"
  start_trainers $(save_args)
  wait_trainers
  restart_agent "$v"
}

# --- the soak ------------------------------------------------------------------------------
KINDS=(none agent_kill coord_kill trainer_kill agent_stop)
[ -n "$STORAGE_FAULT_FLAG" ] && KINDS+=(storage_fault)
RANDOM=$SOAK_SEED
DECK=()
# next_kind: deal from a seeded shuffle of all kinds, reshuffled when empty, so even a short
# run injects every kind.
next_kind() {
  if [ ${#DECK[@]} -eq 0 ]; then
    DECK=("${KINDS[@]}")
    local i j t
    for ((i = ${#DECK[@]} - 1; i > 0; i--)); do
      draw $((i + 1)); j=$DRAW
      t=${DECK[$i]}; DECK[$i]=${DECK[$j]}; DECK[$j]=$t
    done
  fi
  KIND=${DECK[0]}
  DECK=("${DECK[@]:1}")
}

say "seed $SOAK_SEED (rerun: SOAK_SEED=$SOAK_SEED); budget ${BUDGET_S}s of rounds, at most" \
  "$MAX_ROUNDS rounds; faults: ${KINDS[*]}$([ -z "$STORAGE_FAULT_FLAG" ] && echo " (storage_fault: the agent has no --inject_storage_fault)")"
start_coordinator "${COORD_FLAGS[@]}" || fail "the coordinator did not start"
start_agents "$JOB" "$LAYOUT" || fail "the agents did not start"

while [ $ROUND -lt "$MAX_ROUNDS" ] && [ $((SECONDS - START_S)) -lt "$BUDGET_S" ]; do
  ROUND=$((ROUND + 1))
  STEP=$((ROUND * 10))
  # Every draw happens here, whatever the outcome, so a seed replays the same faults.
  next_kind
  draw "$WORLD"; VICTIM=$DRAW
  draw 1000000; PICK=$DRAW
  ensure_ready
  FAULTS[$KIND]=$((${FAULTS[$KIND]:-0} + 1))
  CRASHED=0
  DETAIL=-
  # Bash notices of processes the fault killed ("Killed ...") go to a log, not the output.
  "fault_$KIND" 2>>"$DIR/logs/shell-notices.log"
  SAVE_RCS="${TRAINER_RCS[*]}"
  await_outcome
  case "$OUTCOME" in
    committed) COMMITTED=$((COMMITTED + 1)) ;;
    aborted)
      ABORTED=$((ABORTED + 1))
      REASONS[$REASON]=$((${REASONS[$REASON]:-0} + 1))
      SEEN_ABORTED[$STEP]=$REASON
      [ "$REASON" != - ] && [ "$REASON" != UNSPECIFIED ] ||
        fail "the save of step $STEP aborted without a reason in tessera status"
      [ ! -e "$DIR/ckpt/$JOB/step-$(printf %09d $STEP)" ] ||
        fail "the save of step $STEP aborted ($REASON) but its step directory exists"
      ;;
    not_started) NOT_STARTED=$((NOT_STARTED + 1)) ;;
  esac
  # The outcome agrees with the trainers and with what the fault allows.
  if [ "$KIND" != trainer_kill ] && [ $TRAINERS_OK -eq 1 ] && [ "$OUTCOME" != committed ]; then
    fail "every trainer succeeded but the save is $OUTCOME ($REASON)"
  fi
  case "$KIND" in
    none | trainer_kill)
      [ "$OUTCOME" = committed ] || fail "$DETAIL: the save is $OUTCOME ($REASON), not committed" ;;
    agent_kill)
      if [ $CRASHED -eq 1 ]; then
        [ "$OUTCOME" = aborted ] || fail "$DETAIL: the save is $OUTCOME, not aborted"
      else
        [ "$OUTCOME" = committed ] || fail "$DETAIL: the save is $OUTCOME ($REASON), not committed"
      fi
      ;;
  esac
  if [ "$OUTCOME" = committed ] && [ $TRAINERS_OK -eq 0 ] && [ "$KIND" != trainer_kill ]; then
    say "note: a trainer reported failure (rcs $SAVE_RCS) but step $STEP committed"
  fi
  opened=$(count_lines "$DIR/logs/coordinator.log" "opened for job $JOB step $STEP\$")
  if [ "$opened" -gt 1 ]; then
    ORPHANS=$((ORPHANS + opened - 1))
    say "note: $opened sessions were opened for step $STEP (a late plan reopened the aborted step)"
  fi
  check_invariants
  loaded=""
  if [ $((ROUND % LOAD_EVERY)) -eq 0 ]; then
    reload_latest
    loaded="; latest reloaded byte-identical"
  fi
  say "round $ROUND step $STEP: $KIND: $DETAIL -> $OUTCOME$([ "$OUTCOME" = aborted ] && echo " ($REASON)");" \
    "trainers rc $SAVE_RCS; $LISTED_COUNT listed verified; latest $NEWEST_COMMITTED$loaded"
done

ROUND_END=$ROUND
ensure_ready
check_invariants
reload_latest
KIND=final
stop_agents || fail "an agent did not stop cleanly within 10 s"
stop_coordinator || fail "the coordinator did not stop cleanly within 10 s"
[ "$COMMITTED" -gt 0 ] || fail "no save committed in $ROUND_END rounds"
summary OK
echo "PASS: $ROUND_END soak rounds (seed $SOAK_SEED); every committed checkpoint verified after each round"
