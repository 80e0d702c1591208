#!/usr/bin/env bash
# Seed scenario pp_stages_reuse_layer_names, the parts tests/e2e/seed_scenarios_test.sh does not
# cover, with Python trainer ranks on pp=2 x tp=2 (stage-unique layer names layers.0-1 and
# layers.2-3; refusal of reused names is in tests/e2e and client/python):
# - TP-replicated norm weights (replicated_over tp) and a tied embedding held by the first and
#   the last stage, declared replicated over pp: accepted (no false DUPLICATE_FQN), verified,
#   and reloaded byte-identical on another layout (pp=1 x tp=4);
# - a declared replica whose bytes differ on one rank (a norm weight over tp; the tied
#   embedding over pp): REPLICA_DIVERGED on every rank, no step directory, `latest` unchanged
#   and still verifying and loading.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
mkdir -p "$DIR/logs" "$DIR/pp"

start_coordinator || fail "coordinator"
LAYOUT=pp=2,tp=2
start_agents pp "$LAYOUT" || fail "agents ($LAYOUT)"

run_ranks pp "$LAYOUT" pp-save --out "$DIR/pp" --step 1 ||
  fail "replicated norms and a tied embedding declared over pp were not accepted"
expect_all_ranks pp "$LAYOUT" pp-save "^ok: rank [0-9]+ saved step 1 "
verify_step pp 1
"$BIN/client/cli/tessera" inspect --json "$(step_dir pp 1)" >"$DIR/logs/inspect-pp-1.json" 2>&1 ||
  fail "inspect: $(cat "$DIR/logs/inspect-pp-1.json")"
for fqn in tok_embeddings.weight norm.weight layers.0.attention_norm.weight \
  layers.3.ffn_norm.weight layers.2.attention.wq.weight; do
  grep -q "\"$fqn\"" "$DIR/logs/inspect-pp-1.json" || fail "step 1 has no tensor $fqn"
done
echo "ok: replicated over tp and tied over pp accepted; all layers saved"

n=2
for fqn in layers.0.attention_norm.weight tok_embeddings.weight; do
  run_ranks pp "$LAYOUT" pp-diverge --out "$DIR/pp" --step "$n" --diverge "$fqn" ||
    fail "a diverged replica of $fqn was not refused with REPLICA_DIVERGED on every rank"
  expect_all_ranks pp "$LAYOUT" pp-diverge "^ok: rank [0-9]+: step $n refused with REPLICA_DIVERGED"
  expect_not_written pp "$n"
  echo "ok: a diverged replica of $fqn: REPLICA_DIVERGED, step $n not written, latest still 1"
  n=$((n + 1))
done
verify_step pp 1

switch_layout pp pp=1,tp=4
run_ranks pp pp=1,tp=4 pp-load --out "$DIR/pp" --step 1 || fail "reloading step 1 on pp=1,tp=4"
expect_all_ranks pp pp=1,tp=4 pp-load "^ok: rank [0-9]+ loaded latest = step 1 .*byte-identical"
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: pp_stages_reuse_layer_names: replicas over tp and pp accepted and reloaded;" \
  "diverged replicas refused"
