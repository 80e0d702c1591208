#!/usr/bin/env bash
# tessera.dcp as a drop-in for PyTorch DCP (issue 49): dcp_switch_rank.py, one training script,
# run once with `import torch.distributed.checkpoint as dcp` and once with
# `import tessera.dcp as dcp` (its --api): 2 FSDP2 ranks over gloo save at step 3 (model,
# optimizer, a Stateful LR scheduler, non-tensor values), fresh processes load it in place and
# train to step 6. Both resumes must end in bitwise the same parameters and optimizer state,
# with the values and the scheduler restored. Then the way in and out (python -m
# tessera.convert): DCP's step-3 checkpoint converted into Tessera (job dcpconv) and resumed
# with tessera.dcp on 2 ranks, and tessera.dcp's step 3 converted to DCP and resumed with
# DCP's load: both end in the same state again.
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

# ranks API MODE [CKPT [JOB]]: both ranks of one run (checkpoint_id CKPT/step-3, default
# $DIR/API; agents of JOB, default dcpsw), bounded; fails naming the rank that did.
ranks() {
  local api=$1 mode=$2 ckpt=${3:-$DIR/$1} job=${4:-dcpsw} r pids=()
  runs=$((runs + 1))  # a fresh rendezvous file per run
  for r in 0 1; do
    timeout -k 5 120 "$PYTHON" -P "$RANK" "$mode" --api="$api" --rank="$r" --world=2 \
      --rdzv="$DIR/rdzv-$runs" --ckpt="$ckpt" --agent="$SOCK_DIR/$job-$r.sock" ${ASYNC:-} \
      >"$DIR/logs/rank-$api-$mode-$job-$r.out" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}" || fail "$api $mode ($job) rank $r: $(tail -n 3 "$DIR/logs/rank-$api-$mode-$job-$r.out")"
  done
}
runs=0
final() { sed -n 's/.*final //p' "$DIR/logs/rank-$1-resume-${2:-dcpsw}-0.out"; }

start_coordinator || fail "coordinator"
start_agents dcpsw dp_shard=2 || fail "agents"
ranks dcp save
ranks dcp resume
ASYNC=--async_save ranks tessera save  # tessera.dcp.async_save: its future names the commit
grep -q "^async_save committed .*/dcpsw/step-000000003$" "$DIR/logs/rank-tessera-save-dcpsw-0.out" ||
  fail "async_save's future did not name the committed step: $(cat "$DIR/logs/rank-tessera-save-dcpsw-0.out")"
ranks tessera resume
verify_step dcpsw 3
dcp_final=$(final dcp)
tessera_final=$(final tessera)
[ -n "$dcp_final" ] && [ "$dcp_final" = "$tessera_final" ] ||
  fail "the resumed runs differ: DCP ${dcp_final:-none}, tessera.dcp ${tessera_final:-none}"
stop_agents || fail "agents did not stop cleanly"

# The way in: DCP's checkpoint into Tessera, resumed through tessera.dcp on another job's agents.
"$PYTHON" -m tessera.convert from-dcp "$DIR/dcp/step-3" --coordinator="$(coordinator_address)" \
  --job=dcpconv --step=3 --agent-bin="$BIN/agent/tessera-agent" >"$DIR/logs/from-dcp.out" 2>&1 &&
  fail "from-dcp read a pickle without --trust-pickle"
grep -q "is a pickle: reading it runs code" "$DIR/logs/from-dcp.out" ||
  fail "the refusal does not say why: $(cat "$DIR/logs/from-dcp.out")"
"$PYTHON" -m tessera.convert from-dcp "$DIR/dcp/step-3" --trust-pickle \
  --coordinator="$(coordinator_address)" --job=dcpconv --step=3 \
  --agent-bin="$BIN/agent/tessera-agent" >"$DIR/logs/from-dcp.out" 2>&1 ||
  fail "from-dcp: $(tail -n 5 "$DIR/logs/from-dcp.out")"
verify_step dcpconv 3
start_agents dcpconv dp_shard=2 || fail "agents of dcpconv"
ranks tessera resume "$DIR/tessera" dcpconv
[ "$(final tessera dcpconv)" = "$dcp_final" ] ||
  fail "resumed from the converted DCP checkpoint: $(final tessera dcpconv), not $dcp_final"
stop_agents || fail "agents of dcpconv did not stop cleanly"

# The way out: tessera.dcp's step 3 as a DCP checkpoint, resumed through DCP's own load.
"$PYTHON" -m tessera.convert to-dcp "$(step_dir dcpsw 3)" "$DIR/to-dcp/step-3" \
  --cli="$BIN/client/cli/tessera" >"$DIR/logs/to-dcp.out" 2>&1 ||
  fail "to-dcp: $(tail -n 5 "$DIR/logs/to-dcp.out")"
ranks dcp resume "$DIR/to-dcp" dcpsw
[ "$(final dcp dcpsw)" = "$dcp_final" ] ||
  fail "DCP resumed from the converted Tessera checkpoint to $(final dcp dcpsw), not $dcp_final"
cat "$DIR/logs/from-dcp.out" "$DIR/logs/to-dcp.out"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: one script, two imports: DCP and tessera.dcp saved at step 3 and resumed to the same" \
  "state at step 6 (sha256 $dcp_final), values and scheduler restored; DCP -> Tessera and" \
  "Tessera -> DCP conversions resumed to that state too"
