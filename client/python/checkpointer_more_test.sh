#!/usr/bin/env bash
# tessera.torch.Checkpointer, more of it (issue 49; checkpointer_more_rank.py): tensor
# parallelism (ColwiseParallel / RowwiseParallel DTensors) on tp=2 over gloo, torchdata's
# StatefulDataLoader, and a save the coordinator refuses (the ranks' job-wide values differ:
# REPLICA_DIVERGED), which the next save reports in last_save_error with a warning and
# commits after. Step 3 saved, every rank SIGKILLed, resumed: tensors bitwise, each rank's
# loader at its saved position.
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
RANK=client/python/checkpointer_more_rank.py

start_coordinator || fail "coordinator"
start_agents tp tp=2 || fail "agents on tp=2"
launch tp tp=2 train "$RANK" train --rdzv="$DIR/rdzv-train" --dump="$DIR/dump"
kill_when_all_hang train 2 4
finish train 10
for r in 0 1; do
  grep -q "^step 1's save refused" "$DIR/logs/train-$r.out" &&
    grep -q "^step 2 committed after the failed save" "$DIR/logs/train-$r.out" &&
    grep -q "^hanging at step 4" "$DIR/logs/train-$r.out" ||
    fail "train rank $r: $(tail -n 8 "$DIR/logs/train-$r.out")"
done
verify_step tp 3
[ -e "$(step_dir tp 1)" ] && fail "the refused step 1 left $(step_dir tp 1)"

launch tp tp=2 resume "$RANK" resume --rdzv="$DIR/rdzv-resume" --dump="$DIR/dump"
finish resume 120
grep -v "^[0-1] 0 exited$" "$DIR/logs/resume.rc" && fail "a resume rank failed: $(cat "$DIR"/logs/resume-*.out | tail -n 20)"
for r in 0 1; do
  for line in "bitwise identical" "the StatefulDataLoader's next batch is the saved run's"; do
    grep -q "^ok: rank $r.*$line" "$DIR/logs/resume-$r.out" || fail "resume rank $r: no '$line'"
  done
done
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
cat "$DIR"/logs/train-0.out "$DIR"/logs/resume-0.out
echo "PASS: Checkpointer: TP on tp=2 saved, killed, resumed bitwise; StatefulDataLoader" \
  "position restored; a refused save reported in last_save_error, the next one committed"
