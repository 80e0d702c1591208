#!/usr/bin/env bash
# Overlapped saves end to end (docs/design/overlapped-save.md): a coordinator whose COPYING
# deadline is 3 s (a trainer killed after BeginSave answered is noticed by it), one agent each
# of jobs "ovplain", "ovwrite", "ovkill" (dp=1), two each of "ovfsdp" (dp_shard=2) and "ovtp"
# (tp=2). Then overlapped_save_test.py (one process: a save every step, a write before the
# fence, trainers gone before their fence), FSDP2 ranks over gloo (overlapped_save_rank.py
# fsdp) with reshard_after_forward on and off, and tensor-parallel ranks (tp).
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=3000
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
export GLOO_SOCKET_IFNAME=lo
mkdir -p "$DIR/logs"

start_coordinator --copying_timeout_s=3 || fail "coordinator"
start_jobs ovplain:dp=1 ovwrite:dp=1 ovkill:dp=1 ovfsdp:dp_shard=2 ovtp:tp=2 || fail "agents"

export TESSERA_E2E_SOCK_DIR=$SOCK_DIR TESSERA_E2E_DIR=$DIR
./client/python/run_python_test.sh client/python/overlapped_save_test.py ||
  fail "overlapped_save_test.py"

RANK=client/python/overlapped_save_rank.py
launch ovfsdp dp_shard=2 fsdp-resharded "$RANK" fsdp --step=1 --rdzv="$DIR/rdzv-1"
finish fsdp-resharded 120
launch ovfsdp dp_shard=2 fsdp-unsharded "$RANK" fsdp --step=11 --keep_unsharded --rdzv="$DIR/rdzv-2"
finish fsdp-unsharded 120
launch ovtp tp=2 tp "$RANK" tp --step=1 --rdzv="$DIR/rdzv-3"
finish tp 120
for run in fsdp-resharded fsdp-unsharded tp; do
  for r in 0 1; do
    grep -q "^ok: rank $r .*: steps .* bitwise the state at save()" "$DIR/logs/$run-$r.out" &&
      grep -q "^ok: rank $r: a write into a DTensor before the fence caught" "$DIR/logs/$run-$r.out" ||
      fail "$run rank $r: $(tail -n 5 "$DIR/logs/$run-$r.out")"
  done
  cat "$DIR/logs/$run-0.out" "$DIR/logs/$run-1.out"
done

stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: overlapped saves: every commit bitwise the state at save() (plain with gradient" \
  "accumulation, bf16 autocast and clipping; FSDP2 with reshard_after_forward on and off; TP);" \
  "a write before the fence caught, that step never committed; trainers gone before the fence" \
  "leave no committed step"
