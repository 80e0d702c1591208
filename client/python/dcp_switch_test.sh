#!/usr/bin/env bash
# tessera.dcp as a drop-in for PyTorch DCP (issue 49): dcp_switch_rank.py, one training script,
# run once with `import torch.distributed.checkpoint as dcp` and once with
# `import tessera.dcp as dcp` (its --api): 2 FSDP2 ranks over gloo save at step 3 (model,
# optimizer, a Stateful LR scheduler, non-tensor values), fresh processes load it in place and
# train to step 6. Both resumes must end in bitwise the same parameters and optimizer state,
# with the values and the scheduler restored.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
export GLOO_SOCKET_IFNAME=lo
mkdir -p "$DIR/logs" "$DIR/dcp"
RANK=client/python/dcp_switch_rank.py

# ranks API MODE: both ranks of one run, bounded; fails naming the rank that did.
ranks() {
  local api=$1 mode=$2 r pids=()
  for r in 0 1; do
    timeout -k 5 120 "$PYTHON" -P "$RANK" "$mode" --api="$api" --rank="$r" --world=2 \
      --rdzv="$DIR/rdzv-$api-$mode" --ckpt="$DIR/$api" --agent="$SOCK_DIR/dcpsw-$r.sock" \
      >"$DIR/logs/rank-$api-$mode-$r.out" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || fail "$api $mode rank $r: $(tail -n 3 "$DIR/logs/rank-$api-$mode-$r.out")"; done
}

start_coordinator || fail "coordinator"
start_agents dcpsw dp_shard=2 || fail "agents"
for api in dcp tessera; do
  ranks "$api" save
  ranks "$api" resume
done
verify_step dcpsw 3
dcp_final=$(sed -n 's/.*final //p' "$DIR/logs/rank-dcp-resume-0.out")
tessera_final=$(sed -n 's/.*final //p' "$DIR/logs/rank-tessera-resume-0.out")
[ -n "$dcp_final" ] && [ "$dcp_final" = "$tessera_final" ] ||
  fail "the resumed runs differ: DCP ${dcp_final:-none}, tessera.dcp ${tessera_final:-none}"
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: one script, two imports: DCP and tessera.dcp saved at step 3 and resumed to the same" \
  "state at step 6 (sha256 $dcp_final), values and scheduler restored"
