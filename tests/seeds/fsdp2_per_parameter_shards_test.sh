#!/usr/bin/env bash
# Seed scenario fsdp2_per_parameter_shards (torchtitan's move to per-parameter FSDP, FSDP2),
# with real FSDP2: fsdp2_rank.py trains a small llama-like model over gloo on the CPU with
# fully_shard — and FSDP x TP (parallelize_module under fully_shard, _StridedShard placements)
# — and saves through tessera the state dicts get_model_state_dict / get_optimizer_state_dict
# return: every box derived from the DTensors' placements, uneven and empty shards as torch
# makes them. Runs, one process per rank, each job with its own agents:
#   fsdpref  dp_shard=4, uninterrupted: 6 steps, a save every 2 — the reference;
#   fsdp     dp_shard=4, all four SIGKILLed while stopped at the start of step 5 (step 4
#            committed); resumed from `latest` on dp_shard=2: another mesh;
#   tpref    dp_shard=2 x tp=2, uninterrupted (rank 0 also writes each saved step whole);
#   tp       dp_shard=2 x tp=2 killed the same way; resumed on dp_shard=1 x tp=2;
#   then tpref's step 6 loaded on FSDP only (dp_shard=2), and by one process into a plain
#   model (which also opens every data file with the safetensors library and loads
#   `tessera export --consolidate` with safetensors.torch.load_file).
# This script runs the processes; fsdp2_seed_test.py asserts on their output (one JUnit case
# per property): losses after each resume bitwise identical to the uninterrupted run's, and
# the final parameters and optimizer state; every committed checkpoint verifies.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
export GLOO_SOCKET_IFNAME=lo
mkdir -p "$DIR/logs" "$DIR/dump"
TRAINER=tests/seeds/fsdp2_rank.py
RUN_TIMEOUT=240

start_coordinator || fail "coordinator"

# run JOB LAYOUT RUN [flags...]: one uninterrupted run of the trainers.
run() {
  local job=$1 layout=$2 name=$3
  shift 3
  launch "$job" "$layout" "$name" "$TRAINER" "$@" --rdzv="$DIR/rdzv-$name"
  finish "$name" "$RUN_TIMEOUT"
}

# killed_and_resumed JOB LAYOUT NEW_LAYOUT: all ranks SIGKILLed at the start of step 5,
# then the job resumed on NEW_LAYOUT.
killed_and_resumed() {
  local job=$1 layout=$2 new_layout=$3
  start_agents "$job" "$layout" || fail "agents of $job ($layout)"
  launch "$job" "$layout" "$job-killed" "$TRAINER" train --hang_at_step=5 --rdzv="$DIR/rdzv-$job-killed"
  kill_when_all_hang "$job-killed" "$(world_size "$layout")" 5
  finish "$job-killed" 10
  switch_layout "$job" "$new_layout"
  run "$job" "$new_layout" "$job-resumed" train
  stop_agents || fail "agents of $job did not stop cleanly"
}

start_agents fsdpref dp_shard=4 || fail "agents of fsdpref"
run fsdpref dp_shard=4 fsdpref train
stop_agents || fail "agents of fsdpref did not stop cleanly"
killed_and_resumed fsdp dp_shard=4 dp_shard=2

start_agents tpref dp_shard=2,tp=2 || fail "agents of tpref"
run tpref dp_shard=2,tp=2 tpref train --dump="$DIR/dump"
# tpref's step 6 on other meshes: FSDP only, then one plain process.
switch_layout tpref dp_shard=2
run tpref dp_shard=2 tpref-load-fsdp load --step=6 --dump="$DIR/dump"
switch_layout tpref dp_shard=1
mkdir -p "$DIR/work"
launch tpref dp_shard=1 tpref-load-plain "$TRAINER" plain --step=6 --dump="$DIR/dump" \
  --ckpt="$(step_dir tpref 6)" --cli="$PWD/client/cli/tessera" --work="$DIR/work"
finish tpref-load-plain "$RUN_TIMEOUT"
stop_agents || fail "agents of tpref did not stop cleanly"
killed_and_resumed tp dp_shard=2,tp=2 dp_shard=1,tp=2

export TESSERA_SEED_DIR=$DIR
./client/python/run_python_test.sh tests/seeds/fsdp2_seed_test.py
rc=$?
stop_coordinator || fail "coordinator did not stop cleanly"
exit "$rc"
