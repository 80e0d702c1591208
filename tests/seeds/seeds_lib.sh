# Shared by the seed scenario tests (source after deploy/lib/procs.sh and deploy/lib/cluster.sh,
# with BIN and DIR set): Python trainer ranks (seed_rank.py) and layout switches.

PYTHON=${TESSERA_PYTHON:?python_sh_test (bazel/python.bzl) sets it}
RANK_TIMEOUT=${RANK_TIMEOUT:-120}
export PYTHONPATH="$PWD/client/python/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

fail() {
  echo "FAIL: $*"
  tail -n 20 "$DIR"/logs/rank-*.out 2>/dev/null | grep -v '^$' | tail -n 60
  tail -n 10 "$DIR"/logs/coordinator.log 2>/dev/null
  exit 1
}

step_dir() { echo "$DIR/ckpt/$1/step-$(printf %09d "$2")"; }

# run_ranks JOB LAYOUT MODE [seed_rank.py flags...]: one seed_rank.py per rank of LAYOUT, in
# parallel, each bounded by RANK_TIMEOUT; non-zero if any failed. Output of rank R:
# $DIR/logs/rank-JOB-MODE-R.out (printed on failure).
run_ranks() {
  local job=$1 layout=$2 mode=$3; shift 3
  local n r rc=0
  n=$(world_size "$layout")
  TRAINER_PIDS=()
  for r in $(seq 0 $((n - 1))); do
    # -P: the script's directory must not shadow the built package.
    timeout -k 5 "$RANK_TIMEOUT" "$PYTHON" -P tests/seeds/seed_rank.py "$mode" \
      --agent "$SOCK_DIR/$job-$r.sock" "$@" >"$DIR/logs/rank-$job-$mode-$r.out" 2>&1 &
    TRAINER_PIDS+=($!)
  done
  for r in $(seq 0 $((n - 1))); do wait "${TRAINER_PIDS[$r]}" || rc=1; done
  TRAINER_PIDS=()
  for r in $(seq 0 $((n - 1))); do
    cat "$DIR/logs/rank-$job-$mode-$r.out"
  done
  return $rc
}

# expect_all_ranks JOB LAYOUT MODE REGEX: every rank's output has a line matching REGEX.
expect_all_ranks() {
  local job=$1 layout=$2 mode=$3 regex=$4 n r
  n=$(world_size "$layout")
  for r in $(seq 0 $((n - 1))); do
    grep -Eq -- "$regex" "$DIR/logs/rank-$job-$mode-$r.out" ||
      fail "rank $r of $job ($mode on $layout) printed no line matching /$regex/"
  done
}

# switch_layout JOB LAYOUT: stops the job's agents and starts those of LAYOUT. The new agents
# retry their registration until the old agents' leases expired (a job's mesh changes only
# once all its agents are gone); start_agents waits for every one, bounded.
switch_layout() {
  stop_agents || fail "the agents of $1 did not stop cleanly"
  start_agents "$1" "$2" || fail "agents of $1 on $2"
}

# verify_step JOB STEP: `tessera verify` of the committed step passes.
verify_step() {
  local dir out
  dir=$(step_dir "$1" "$2")
  out="$DIR/logs/verify-$1-$2.out"
  [ -f "$dir/manifest.pb" ] || fail "step $2 of $1 is not committed"
  "$BIN/client/cli/tessera" verify "$dir" >"$out" 2>&1 || fail "verify $dir: $(cat "$out")"
  grep -q "^OK: " "$out" || fail "verify $dir did not print OK: $(cat "$out")"
  echo "verify $1 step $2: $(grep '^OK: ' "$out")"
}

# expect_not_written JOB STEP: neither step-N nor a partial step-N.tmp-* directory remains
# (the coordinator removes an aborted session's directory; polled for up to 10 s).
_nothing_named() { ! ls -A "$1" 2>/dev/null | grep -q "^$2"; }
expect_not_written() {
  local name
  name=$(basename "$(step_dir "$1" "$2")")
  wait_until 10 _nothing_named "$DIR/ckpt/$1" "$name" ||
    fail "the refused step $2 left $(ls -A "$DIR/ckpt/$1" | grep "^$name")"
}

# launch JOB LAYOUT RUN SCRIPT [args...]: one `$PYTHON -P SCRIPT args --agent <rank's socket>`
# per rank of LAYOUT, in the background (pids in TRAINER_PIDS, so stop_all kills them);
# output in $DIR/logs/RUN-<rank>.out. Then `finish RUN TIMEOUT_S`.
launch() {
  local job=$1 layout=$2 run=$3 script=$4 n r
  shift 4
  n=$(world_size "$layout")
  TRAINER_PIDS=()
  RUN_START=$(date +%s)
  for r in $(seq 0 $((n - 1))); do
    "$PYTHON" -P "$script" "$@" --agent="$SOCK_DIR/$job-$r.sock" >"$DIR/logs/$run-$r.out" 2>&1 &
    TRAINER_PIDS+=($!)
  done
}

# finish RUN TIMEOUT_S: waits for every process of the run, SIGKILLing any still alive after
# TIMEOUT_S; writes "<rank> <exit status> <exited|killed>" lines to $DIR/logs/RUN.rc and a
# summary line to stdout.
finish() {
  local run=$1 deadline=$(($(date +%s) + $2)) r=0 p how
  : >"$DIR/logs/$run.rc"
  for p in "${TRAINER_PIDS[@]}"; do
    wait_until $((deadline > $(date +%s) ? deadline - $(date +%s) : 0)) exited "$p"
    how=exited
    if kill -0 "$p" 2>/dev/null; then
      kill -KILL "$p" 2>/dev/null
      how=killed
    fi
    wait "$p"
    echo "$r $? $how" >>"$DIR/logs/$run.rc"
    r=$((r + 1))
  done
  TRAINER_PIDS=()
  echo "run $run: $(cut -d' ' -f2,3 "$DIR/logs/$run.rc" | tr '\n' ',') $(($(date +%s) - RUN_START)) s"
} 2>/dev/null  # bash's "Killed" job notices: the exit statuses are in RUN.rc

# kill_when_all_hang RUN N STEP: waits (bounded) until ranks 0..N-1 of RUN printed "hanging at
# step STEP", then SIGKILLs every process of the run.
kill_when_all_hang() {
  local run=$1 n=$2 step=$3 r p
  for r in $(seq 0 $(($2 - 1))); do
    wait_for_line "$DIR/logs/$run-$r.out" "^hanging at step $step" 90 || break
  done
  for p in "${TRAINER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
