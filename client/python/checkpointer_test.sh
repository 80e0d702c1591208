#!/usr/bin/env bash
# tessera.torch.Checkpointer end to end (issue 49): FSDP2 ranks over gloo on the CPU
# (checkpointer_rank.py) checkpoint through the Checkpointer alone. Job "ck" on dp_shard=2
# saves step 0 before the first optimizer step and step 4 after training, then every rank is
# SIGKILLed; the job resumes on dp_shard=4, another mesh, where every rank must find the model
# and optimizer bitwise, the job-wide state (param groups, LR scheduler, a Stateful extra), and
# — ranks 0 and 1 — its loader position and RNGs; ranks 2 and 3, which did not exist, report
# theirs as not restored. Then a plain module (no FSDP, one process, job "ckplain") saved,
# killed and resumed the same way, and DDP on dp=2 (job "ckddp") resumed on dp=1, its optimizer
# SGD without momentum (an optimizer that never has state).
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
RANK=client/python/checkpointer_rank.py

start_coordinator || fail "coordinator"
start_agents ck dp_shard=2 || fail "agents on dp_shard=2"
launch ck dp_shard=2 train "$RANK" train --rdzv="$DIR/rdzv-train" --dump="$DIR/dump"
kill_when_all_hang train 2 5
finish train 10
for r in 0 1; do
  grep -q "^saved step 0 before the first optimizer step" "$DIR/logs/train-$r.out" &&
    grep -q "^committed 4 " "$DIR/logs/train-$r.out" && grep -q "^hanging at step 5" "$DIR/logs/train-$r.out" ||
    fail "train rank $r: $(tail -n 5 "$DIR/logs/train-$r.out")"
done
verify_step ck 0
verify_step ck 4

switch_layout ck dp_shard=4
launch ck dp_shard=4 resume "$RANK" resume --rdzv="$DIR/rdzv-resume" --dump="$DIR/dump"
finish resume 180
grep -v "^[0-3] 0 exited$" "$DIR/logs/resume.rc" && fail "a resume rank failed: $(cat "$DIR/logs/resume.rc")"
for r in 0 1 2 3; do
  for line in "model and optimizer tensors bitwise identical" "scheduler and extra state restored"; do
    grep -q "^ok: rank $r.*$line" "$DIR/logs/resume-$r.out" || fail "resume rank $r: no '$line'"
  done
done
for r in 0 1; do
  grep -q "^ok: rank $r: loader position and the next RNG draws restored" "$DIR/logs/resume-$r.out" ||
    fail "resume rank $r: its loader and RNGs were not restored"
done
for r in 2 3; do
  grep -q "^ok: rank $r did not exist at the save" "$DIR/logs/resume-$r.out" ||
    fail "resume rank $r: missing per-rank state not reported"
done
stop_agents || fail "agents did not stop cleanly"

mkdir -p "$DIR/dump-plain"
start_agents ckplain dp=1 || fail "agents of ckplain"
launch ckplain dp=1 train-plain "$RANK" train --wrap=plain --rdzv=unused --dump="$DIR/dump-plain"
kill_when_all_hang train-plain 1 5
finish train-plain 10
grep -q "^committed 4 " "$DIR/logs/train-plain-0.out" || fail "plain train: $(tail -n 5 "$DIR/logs/train-plain-0.out")"
launch ckplain dp=1 resume-plain "$RANK" resume --wrap=plain --rdzv=unused --dump="$DIR/dump-plain"
finish resume-plain 120
grep -q "^0 0 exited$" "$DIR/logs/resume-plain.rc" || fail "plain resume: $(tail -n 5 "$DIR/logs/resume-plain-0.out")"
grep -q "^ok: rank 0 of a plain module: .* bitwise identical" "$DIR/logs/resume-plain-0.out" &&
  grep -q "^ok: rank 0: loader position and the next RNG draws restored" "$DIR/logs/resume-plain-0.out" ||
  fail "plain resume: $(cat "$DIR/logs/resume-plain-0.out")"
stop_agents || fail "agents of ckplain did not stop cleanly"

mkdir -p "$DIR/dump-ddp"
start_agents ckddp dp=2 || fail "agents of ckddp"
launch ckddp dp=2 train-ddp "$RANK" train --wrap=ddp --optimizer=sgd --rdzv="$DIR/rdzv-ddp-train" --dump="$DIR/dump-ddp"
kill_when_all_hang train-ddp 2 5
finish train-ddp 10
grep -q "^committed 4 " "$DIR/logs/train-ddp-0.out" || fail "DDP train: $(tail -n 5 "$DIR/logs/train-ddp-0.out")"
switch_layout ckddp dp=1
launch ckddp dp=1 resume-ddp "$RANK" resume --wrap=ddp --optimizer=sgd --rdzv="$DIR/rdzv-ddp-resume" --dump="$DIR/dump-ddp"
finish resume-ddp 120
grep -q "^0 0 exited$" "$DIR/logs/resume-ddp.rc" || fail "DDP resume: $(tail -n 5 "$DIR/logs/resume-ddp-0.out")"
grep -q "^ok: rank 0 of 1 (ddp): .* bitwise identical" "$DIR/logs/resume-ddp-0.out" &&
  grep -q "^ok: rank 0: loader position and the next RNG draws restored" "$DIR/logs/resume-ddp-0.out" ||
  fail "DDP resume: $(cat "$DIR/logs/resume-ddp-0.out")"
stop_agents || fail "agents of ckddp did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
cat "$DIR"/logs/resume-0.out "$DIR"/logs/resume-plain-0.out "$DIR"/logs/resume-ddp-0.out
echo "PASS: Checkpointer: saved on dp_shard=2 (step 0 before any optimizer step, step 4), killed," \
  "resumed on dp_shard=4: model, optimizer, scheduler, extra state bitwise; RNG and loader per rank;" \
  "a plain module the same in one process; DDP on 2 ranks resumed on 1"
