#!/usr/bin/env bash
# Seed scenario fsdp2_per_parameter_shards (torchtitan's move to per-parameter FSDP, FSDP2):
# Python trainer ranks hold dim-0 shards of every parameter as torch.chunk cuts them (uneven;
# ranks past the last chunk hold an EMPTY shard, declared with its zero-length box) and the
# AdamW state of those shards (exp_avg, exp_avg_sq shaped like them; step). Each checkpoint is
# saved, verified with `tessera verify`, and reloaded on ANOTHER layout, where every rank
# compares its new shards and every whole tensor byte for byte with what was saved:
#   dp_shard=3 -> dp_shard=8;  dp_shard=8 -> dp_shard=3;
#   dp_shard=2 x tp=2 (TP on dim 1 of matrices, norms replicated over tp) -> dp_shard=4.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
mkdir -p "$DIR/logs"

start_coordinator || fail "coordinator"

# saved_ok LAYOUT MODE STEP: every rank of LAYOUT reported saving STEP; then verify it.
saved_ok() {
  expect_all_ranks fsdp "$1" "$2" "^ok: rank [0-9]+ saved step $3 "
  verify_step fsdp "$3"
}
# loaded_ok LAYOUT MODE STEP: every rank of LAYOUT loaded STEP byte-identical.
loaded_ok() {
  expect_all_ranks fsdp "$1" "$2" "^ok: rank [0-9]+ loaded step $3 .*byte-identical"
}

# dp_shard=3: save step 10.
mkdir -p "$DIR/fsdp-10" "$DIR/fsdp-20" "$DIR/fsdp-30"
start_agents fsdp dp_shard=3 || fail "agents (dp_shard=3)"
run_ranks fsdp dp_shard=3 fsdp-save --out "$DIR/fsdp-10" --step 10 || fail "save 10 on dp_shard=3"
saved_ok dp_shard=3 fsdp-save 10
# Empty shards really occurred: rank 2 of 3 holds nothing of the [2, 8] bias.
grep -q "empty shards: .*layers.0.feed_forward.bias" "$DIR/logs/rank-fsdp-fsdp-save-2.out" ||
  fail "rank 2 of dp_shard=3 did not hold an empty shard of the [2, 8] bias"

# dp_shard=8: load step 10 (3 -> 8), then save step 20 from the same processes.
switch_layout fsdp dp_shard=8
run_ranks fsdp dp_shard=8 fsdp-load --out "$DIR/fsdp-10" --step 10 \
  --then_save 20 --then_out "$DIR/fsdp-20" || fail "load 10 / save 20 on dp_shard=8"
loaded_ok dp_shard=8 fsdp-load 10
echo "ok: step 10 saved on dp_shard=3, reloaded on dp_shard=8 byte-identical"
saved_ok dp_shard=8 fsdp-load 20
grep -q "empty shards: .*layers.0.feed_forward.bias" "$DIR/logs/rank-fsdp-fsdp-load-7.out" ||
  fail "rank 7 of dp_shard=8 did not hold an empty shard of the [2, 8] bias"

# dp_shard=3: load step 20 (8 -> 3).
switch_layout fsdp dp_shard=3
run_ranks fsdp dp_shard=3 fsdp-load --out "$DIR/fsdp-20" --step 20 || fail "load 20 on dp_shard=3"
loaded_ok dp_shard=3 fsdp-load 20
echo "ok: step 20 saved on dp_shard=8, reloaded on dp_shard=3 byte-identical"

# dp_shard=2 x tp=2: save step 30; dp_shard=4: load it (2-D -> 1-D).
switch_layout fsdp dp_shard=2,tp=2
run_ranks fsdp dp_shard=2,tp=2 fsdp-save --out "$DIR/fsdp-30" --step 30 ||
  fail "save 30 on dp_shard=2,tp=2"
saved_ok dp_shard=2,tp=2 fsdp-save 30
switch_layout fsdp dp_shard=4
run_ranks fsdp dp_shard=4 fsdp-load --out "$DIR/fsdp-30" --step 30 || fail "load 30 on dp_shard=4"
loaded_ok dp_shard=4 fsdp-load 30
echo "ok: step 30 saved on dp_shard=2,tp=2, reloaded on dp_shard=4 byte-identical"
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: fsdp2_per_parameter_shards: 3 -> 8, 8 -> 3, 2x2 (fsdp x tp) -> 4, empty shards included"
