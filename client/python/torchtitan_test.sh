#!/usr/bin/env bash
# tessera.torchtitan end to end (issue 49): the checkpoint manager driven as torchtitan's
# trainer drives it (torchtitan_rank.py: torchtitan's optimizer, LR scheduler and data loader
# containers, an FSDP2 model on the mesh dim "fsdp"), over gloo on the CPU — torchtitan's
# trainer itself needs CUDA. Job "tt" on fsdp=2 starts from a DCP checkpoint's weights
# (initial_load_path), saves steps 2 and 4 (interval 2, async), then
# every rank is SIGKILLed; it resumes on fsdp=1, another mesh, with the data loader excluded
# from loading (torchtitan's loader refuses another data-parallel degree): model, optimizer,
# scheduler and train state bitwise, the loader afresh; it trains on to the last step, 6, whose
# model rank 0 exports through `tessera export` (last_save_model_only). Back on fsdp=2,
# load_step=4 gives back step 4 again, each rank's loader at its saved position.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
export GLOO_SOCKET_IFNAME=lo
export TESSERA_CLI=$PWD/client/cli/tessera
mkdir -p "$DIR/logs" "$DIR/dump"
RANK=client/python/torchtitan_rank.py
DUMP=--dump="$DIR/dump"

start_coordinator || fail "coordinator"
start_agents tt fsdp=2 || fail "agents on fsdp=2"
launch tt fsdp=2 train "$RANK" train --rdzv="$DIR/rdzv-train" "$DUMP"
kill_when_all_hang train 2 5
finish train 10
for r in 0 1; do
  grep -q "^a fresh job: the model's weights from initial_load_path" "$DIR/logs/train-$r.out" &&
    grep -q "^committed steps \[2, 4\]" "$DIR/logs/train-$r.out" &&
    grep -q "^hanging at step 5" "$DIR/logs/train-$r.out" ||
    fail "train rank $r: $(tail -n 5 "$DIR/logs/train-$r.out")"
done
verify_step tt 4

switch_layout tt fsdp=1
launch tt fsdp=1 resume1 "$RANK" resume --exclude=dataloader --steps=6 --rdzv="$DIR/rdzv-1" "$DUMP"
finish resume1 120
grep -q "^0 0 exited$" "$DIR/logs/resume1.rc" ||
  fail "fsdp=1 failed: $(grep -v '^ok' "$DIR"/logs/resume1-0.out | tail -n 20)"
for line in "model and optimizer bitwise, scheduler and train state (step 4)" \
  "the loader, excluded from loading, starts afresh" "last step 6 saved and its model exported"; do
  grep -q "^ok: .*$line" "$DIR/logs/resume1-0.out" || fail "fsdp=1: no '$line'"
done
verify_step tt 6

switch_layout tt fsdp=2
launch tt fsdp=2 resume2 "$RANK" resume --load-step=4 --rdzv="$DIR/rdzv-2" "$DUMP"
finish resume2 120
grep -v "^[0-1] 0 exited$" "$DIR/logs/resume2.rc" &&
  fail "a rank on fsdp=2 failed: $(cat "$DIR"/logs/resume2-*.out | tail -n 20)"
for r in 0 1; do
  grep -q "^ok: rank $r of 2: model and optimizer bitwise" "$DIR/logs/resume2-$r.out" &&
    grep -q "^ok: rank $r: the loader's next batch is the saved run's" "$DIR/logs/resume2-$r.out" ||
    fail "load_step=4 on fsdp=2, rank $r: $(tail -n 5 "$DIR/logs/resume2-$r.out")"
done
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
cat "$DIR"/logs/resume1-0.out "$DIR"/logs/resume2-0.out
echo "PASS: tessera.torchtitan: started from a DCP checkpoint, saved on fsdp=2 (interval 2, async), killed, resumed on fsdp=1" \
  "(loader excluded) bitwise, last step exported; load_step=4 on fsdp=2 with each loader's position"
