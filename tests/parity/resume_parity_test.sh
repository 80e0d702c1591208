#!/usr/bin/env bash
# PyTorch resume parity (real processes on loopback): PyTorch (the venv's) on the CPU, gloo over a
# FileStore, one tessera agent per rank. parity_trainer.py trains a tiny MLP with data
# parallelism whose gradient sum does not depend on the DP degree (its header says how), for
# $STEPS steps, saving model, AdamW state, LR scheduler, RNG states and data position every
# $SAVE_EVERY steps. Three runs, each its own job:
#   ref:   4 ranks, uninterrupted: every step's loss (exact bits) is the reference;
#   same:  4 ranks; all four SIGKILLed while stopped at the start of step 8 (step 5 committed);
#          resumed from `latest` on 4 ranks;
#   newdp: 4 ranks; rank 2 alone SIGKILLed at the start of step 13 (step 10 committed), the
#          others must fail on their own; the dp=4 agents stop, their leases expire, dp=2
#          agents start, and the run resumes from `latest` on 2 ranks.
# This script only runs the processes; resume_parity_test.py then asserts on their output
# (one JUnit case per property): the resumed losses are bitwise identical to ref's, and so
# are the final parameters and optimizer state; every committed checkpoint passes
# `tessera verify`.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
STEPS=20
SAVE_EVERY=5
RUN_TIMEOUT=120  # seconds for one run of the trainers; each trainer also ends itself (alarm)
PYTHON=${TESSERA_PYTHON:?python_sh_test (bazel/python.bzl) sets it}
export PYTHONPATH="$PWD/client/python/site" PYTHONDONTWRITEBYTECODE=1 GLOO_SOCKET_IFNAME=lo
# Keep the trainers' output with the test's outputs (outputs.zip) for a failure's diagnosis.
keep_logs() {
  [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] &&
    cp "$DIR"/logs/*.out "$DIR"/logs/*.rc "$DIR"/logs/*.log "$TEST_UNDECLARED_OUTPUTS_DIR"/ 2>/dev/null
  stop_all
}
trap keep_logs EXIT
mkdir -p "$DIR/logs"

# launch JOB WORLD RUN [trainer flags...]: one trainer per rank in the background (pids in
# TRAINER_PIDS, so stop_all kills them); output in $DIR/logs/RUN-<rank>.out.
launch() {
  local job=$1 world=$2 run=$3 r
  shift 3
  TRAINER_PIDS=()
  RUN_START=$(date +%s)
  for r in $(seq 0 $((world - 1))); do
    "$PYTHON" -P tests/parity/parity_trainer.py --agent="$SOCK_DIR/$job-$r.sock" \
      --rdzv="$DIR/rdzv-$run" --steps=$STEPS --save_every=$SAVE_EVERY --timeout=150 "$@" \
      >"$DIR/logs/$run-$r.out" 2>&1 &
    TRAINER_PIDS+=($!)
  done
}

# finish RUN TIMEOUT_S: waits for every trainer of the run, SIGKILLing any still alive after
# TIMEOUT_S; writes "<rank> <exit status> <exited|killed>" lines to $DIR/logs/RUN.rc and a
# summary line to stdout.
finish() {
  local run=$1 deadline=$(($(date +%s) + $2)) r=0 p how
  : >"$DIR/logs/$run.rc"
  for p in "${TRAINER_PIDS[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
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

start_coordinator || fail "coordinator"
declare -A JOB_AGENTS
all_agents=()
for job in ref same newdp; do
  start_agents "$job" dp=4
  rc=$?
  JOB_AGENTS[$job]="${AGENT_PIDS[*]}"
  all_agents+=("${AGENT_PIDS[@]}")
  AGENT_PIDS=("${all_agents[@]}")  # start_agents replaces AGENT_PIDS; stop_all needs them all
  [ "$rc" -eq 0 ] || fail "agents of $job"
done

# --- ref: uninterrupted ----------------------------------------------------------------------
launch ref 4 ref
finish ref $RUN_TIMEOUT

# --- same: every trainer killed after step 5 committed, resumed on 4 ranks -------------------
launch same 4 same-killed --hang_at_step=8 --hang_ranks=0,1,2,3
for r in 0 1 2 3; do
  wait_for_line "$DIR/logs/same-killed-$r.out" "^hanging at step 8" 30 || break
done
for p in "${TRAINER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
finish same-killed 10
launch same 4 same-resumed
finish same-resumed $RUN_TIMEOUT

# --- newdp: rank 2 killed after step 10 committed, resumed on 2 ranks by dp=2 agents ---------
launch newdp 4 newdp-killed --hang_at_step=13 --hang_ranks=2
if wait_for_line "$DIR/logs/newdp-killed-2.out" "^hanging at step 13" 30; then
  kill -KILL "${TRAINER_PIDS[2]}" 2>/dev/null
fi
finish newdp-killed 60  # the others' gloo collective fails once rank 2's connections drop
for p in ${JOB_AGENTS[newdp]}; do
  stop_process "$p" 10 || fail "an agent of newdp (dp=4) did not stop cleanly"
done
AGENT_PIDS=(${JOB_AGENTS[ref]} ${JOB_AGENTS[same]})
all_agents=("${AGENT_PIDS[@]}")
start_agents newdp dp=2
rc=$?
AGENT_PIDS+=("${all_agents[@]}")
[ "$rc" -eq 0 ] || fail "dp=2 agents of newdp"
launch newdp 2 newdp-resumed
finish newdp-resumed $RUN_TIMEOUT

export TESSERA_PARITY_DIR=$DIR TESSERA_PARITY_STEPS=$STEPS
./client/python/run_python_test.sh tests/parity/resume_parity_test.py
rc=$?
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
exit "$rc"
