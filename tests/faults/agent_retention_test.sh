#!/usr/bin/env bash
# Retention with a committer agent (issue 11, bug 5): --coordinator_commits=false
# --keep_last=1, three saves (steps 10, 11, 12) by real processes on loopback, tp=2,dp=2. The
# coordinator names the retired steps in each COMMIT and the committer agent removes them
# before it reports the commit written, so once the trainers heard step 12 committed, only
# step-000000012 is left in the job's directory (no older step, no temporary directory),
# `tessera checkpoints` lists only step 12, and it verifies and loads byte for byte. Before
# the fix, retention never removed a directory when agents commit.
source tests/faults/lib.sh

start_coordinator --coordinator_commits=false --keep_last=1 || fail "coordinator"
start_agents "$JOB" "$LAYOUT" || fail "agents"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10,11,12 "${MODEL[@]}" ||
  fail "the saves of steps 10, 11, 12 failed"
expect_committed_status keep_last 12
left=$(ls "$DIR/ckpt/$JOB" | tr '\n' ' ')
[ "$left" = "step-000000012 " ] ||
  fail "with keep_last=1 the job directory holds: $left (expected only step-000000012)"
"$CLI" checkpoints --json --coordinator="127.0.0.1:$COORD_PORT" "$JOB" \
  >"$DIR/logs/checkpoints.json" 2>&1 || fail "tessera checkpoints failed"
listed=$(grep -Eo "\"step\": *\"?[0-9]+" "$DIR/logs/checkpoints.json" | grep -Eo "[0-9]+$" | tr '\n' ' ')
[ "$listed" = "12 " ] || fail "tessera checkpoints lists steps $listed, not only 12"
expect_latest_intact 12
finish
echo "PASS: keep_last=1 with a committer agent: only step 12 is left on disk and listed; it verifies and loads"
