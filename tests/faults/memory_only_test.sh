#!/usr/bin/env bash
# Memory-only saves (issue 16, --persist_every; DESIGN.md "Memory-only saves"), real processes
# on loopback, tp=2,dp=2 on one node:
# - persist_every: steps 1..4 saved with --persist_every=2: 2 and 4 go to disk, 1 and 3 to
#   memory only; `tessera checkpoints` lists the newest commit's kind; no directory of 1 or 3;
#   the disk's latest is step 4;
# - trainer_killed: step 5 (memory-only) saved and every trainer SIGKILLed right after Save
#   returned; the agents commit it in memory; `tessera checkpoints` lists it as memory-only
#   while latest on disk stays step 4; restarted trainers load the newest commit (-2): step 5,
#   byte for byte, every byte from memory;
# - coordinator_restarted: the coordinator restarted on its RocksDB: until the agents have
#   stated their copies again step 5 is listed with its copies unknown and a load needing
#   another agent's copy fails Unavailable (never LOST); then it is held and reloads from memory;
# - agents_killed: every agent SIGKILLed and restarted: once their first heartbeats said they
#   hold nothing (until then its copies are unknown), step 5 is listed LOST, loading it fails
#   with MEMORY_COPY_LOST naming the missing data files, and the disk's latest (step 4)
#   verifies and loads byte for byte;
# - tier_disabled: agents with --memory_tier=false refuse a memory-only save before anything
#   is staged (MEMORY_ONLY_REFUSED); step 4 stays latest;
# - writer_frozen_before_keeping: step 9 (memory-only) committed while rank 1's agent is frozen
#   just before keeping it: listed with its copies unknown, not LOST; resumed, it keeps the step
#   and every rank reloads it from memory.
source tests/faults/lib.sh
ulimit -c 0

COORD="127.0.0.1:0"  # set after start_coordinator

# sum_sources FIELD: FIELD summed over every trainer's "load sources" line.
sum_sources() {
  cat "$DIR"/logs/trainer-"$JOB"-*.out | sed -nE "s/.*load sources:.* $1=([0-9]+).*/\1/p" |
    awk '{s += $1} END {print s + 0}'
}
# checkpoints_json: the coordinator's listing, in $DIR/logs/checkpoints.json.
checkpoints_json() {
  "$CLI" checkpoints --json --coordinator="$COORD" "$JOB" >"$DIR/logs/checkpoints.json" 2>/dev/null
}
# listed STEP KIND: the listing's newest entry is STEP, of KIND: "memory" (memory-only, every
# file in memory), "lost" (memory-only, some file in none), "unknown" (memory-only, not every
# live agent has stated its copies since the coordinator started or it registered) or "disk".
listed() {
  checkpoints_json || return 1
  python3 - "$DIR/logs/checkpoints.json" "$1" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])).get("checkpoints", [])
first = c[0] if c else {}
kind = "disk"
if first.get("memory_only"):
    kind = "lost" if first.get("files_not_in_memory") else "unknown" if first.get("memory_copies_unknown") else "memory"
sys.exit(0 if str(first.get("step")) == sys.argv[2] and kind == sys.argv[3] else 1)
PY
}
# save_then_kill_trainers STEP: every trainer saves STEP (memory-only under --persist_every=2
# when odd) and is SIGKILLed right after Save returned.
save_then_kill_trainers() {
  local r
  start_save "$1" --persist_every=2 --kill_after_save
  for r in 0 1 2 3; do
    wait_pid_bounded "${TRAINER_PIDS[$r]}" "$TRAINER_TIMEOUT" "trainer $r"
    [ "$WAITED_RC" -eq 137 ] || fail "trainer $r exited $WAITED_RC, not SIGKILLed after its save"
  done
  TRAINER_PIDS=()
}
# disk_steps: the step directories on disk, as numbers, ascending.
disk_steps() {
  ls "$DIR/ckpt/$JOB" | sed -nE 's/^step-0*([0-9]+)$/\1/p' | sort -n | tr '\n' ' '
}

start_coordinator || fail "coordinator"
COORD=$(coordinator_address)
start_agents "$JOB" "$LAYOUT" || fail "agents"

# --- persist_every ----------------------------------------------------------------------------
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=1,2,3,4 --persist_every=2 \
  "${MODEL[@]}" || fail "saving steps 1..4 with --persist_every=2"
out0="$DIR/logs/trainer-$JOB-0.out"
grep -q "step 1 committed in memory only" "$out0" || fail "step 1 was not a memory-only commit"
grep -q "step 3 committed in memory only" "$out0" || fail "step 3 was not a memory-only commit"
grep -q "step 2 committed at $(step_dir 2)" "$out0" || fail "step 2 was not committed to disk"
grep -q "step 4 committed at $(step_dir 4)" "$out0" || fail "step 4 was not committed to disk"
[ "$(disk_steps)" = "2 4 " ] || fail "steps on disk: $(disk_steps), expected 2 and 4"
ls "$DIR/ckpt/$JOB" | grep -q 'tmp' && fail "a temporary directory was left: $(ls "$DIR/ckpt/$JOB")"
listed 4 disk || fail "step 4 is not listed as the newest (disk) checkpoint: $(cat "$DIR/logs/checkpoints.json")"
echo "ok: persist_every -> steps 1 and 3 in memory only, 2 and 4 on disk, latest step 4"

# --- trainer_killed ---------------------------------------------------------------------------
save_then_kill_trainers 5
# Committed in memory, and every data file's copy stated by its agent (bounded).
wait_until 30 listed 5 memory ||
  fail "step 5 is not listed as a memory-only commit held in memory: $(cat "$DIR/logs/checkpoints.json")"
python3 - "$DIR/logs/checkpoints.json" <<'PY' || fail "the listing of step 5 and 4 is wrong"
import json, sys
c = json.load(open(sys.argv[1]))["checkpoints"]
assert [str(x["step"]) for x in c] == ["5", "4", "2"], c
assert c[0].get("memory_only") and not c[0].get("dir"), c[0]
assert not c[1].get("memory_only") and c[1]["dir"].endswith("step-000000004"), c[1]
PY
[ "$(latest_step)" = "$(basename "$(step_dir 4)")" ] || fail "latest on disk is $(latest_step), not step 4"
[ -e "$(step_dir 5)" ] && fail "step 5 has a directory on disk"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=load --load_step=-2 "${MODEL[@]}" ||
  fail "loading the newest commit failed: $(grep -h 'FAIL\|rror' "$DIR"/logs/trainer-"$JOB"-*.out | head -n 3)"
for r in 0 1 2 3; do
  grep -q "loaded step 5 " "$DIR/logs/trainer-$JOB-$r.out" || fail "rank $r did not load step 5"
  grep -q "load sources:.* memory_only=1" "$DIR/logs/trainer-$JOB-$r.out" ||
    fail "rank $r's load of step 5 was not memory-only"
done
[ "$(sum_sources disk_bytes)" -eq 0 ] || fail "$(sum_sources disk_bytes) bytes of step 5 came from disk"
[ "$(sum_sources memory_bytes)" -gt 0 ] || fail "nothing came from memory"
[ "$(sum_sources memory_blocks_rejected)" -eq 0 ] || fail "memory blocks rejected"
echo "ok: trainer_killed -> step 5 listed memory-only, latest on disk step 4; step 5 reloaded byte for byte, $(sum_sources memory_bytes) bytes from memory, 0 from disk"

# --- coordinator_restarted --------------------------------------------------------------------
# The coordinator stops and starts again on its RocksDB, telling agents to heartbeat every 15 s:
# they register again at once but state no copies for 15 s. Until they do, step 5
# is listed with its copies unknown — never LOST — and a rank whose load needs another rank's
# file fails Unavailable (retry), never MEMORY_COPY_LOST. Restarted again as before, step 5 is
# held and loads from memory.
stop_coordinator || fail "the coordinator did not stop cleanly"
declare -A registrations
for r in 0 1 2 3; do
  registrations[$r]=$(count_lines "$DIR/logs/agent-$JOB-$r.log" "registered with coordinator")
done
start_coordinator --heartbeat_interval_ms=15000 --lease_ms=60000 || fail "coordinator restart"
registered_again() {
  local r
  for r in 0 1 2 3; do
    [ "$(count_lines "$DIR/logs/agent-$JOB-$r.log" "registered with coordinator \\(lease 60000 ms, heartbeat 15000 ms\\)")" -gt 0 ] &&
      [ "$(count_lines "$DIR/logs/agent-$JOB-$r.log" "registered with coordinator")" -gt "${registrations[$r]}" ] ||
      return 1
  done
}
wait_until 30 registered_again || fail "the agents did not register with the restarted coordinator"
listed 5 unknown ||
  fail "step 5 is not listed with its copies unknown before the agents stated them: $(cat "$DIR/logs/checkpoints.json")"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=load --load_step=-2 "${MODEL[@]}" &&
  fail "every rank loaded step 5 before the agents stated their copies (no rank needed another's file?)"
grep -l "UNAVAILABLE: step 5 is a memory-only checkpoint and the coordinator could not say which agents hold it" \
  "$DIR"/logs/trainer-"$JOB"-*.out >/dev/null ||
  fail "no rank's load failed Unavailable for copies not yet known: $(tail -q -n 1 "$DIR"/logs/trainer-"$JOB"-*.out)"
grep -l "MEMORY_COPY_LOST" "$DIR"/logs/trainer-"$JOB"-*.out && fail "a rank was told step 5 is lost"
restart_coordinator
wait_until 30 listed 5 memory ||
  fail "step 5 is not listed as held in memory after a coordinator restart: $(cat "$DIR/logs/checkpoints.json")"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=load --load_step=-2 "${MODEL[@]}" ||
  fail "loading the newest commit after a coordinator restart failed: $(grep -h 'FAIL\|rror' "$DIR"/logs/trainer-"$JOB"-*.out | head -n 3)"
for r in 0 1 2 3; do
  grep -q "loaded step 5 " "$DIR/logs/trainer-$JOB-$r.out" ||
    fail "rank $r did not load step 5 after the coordinator restarted"
done
[ "$(sum_sources disk_bytes)" -eq 0 ] || fail "$(sum_sources disk_bytes) bytes of step 5 came from disk"
echo "ok: coordinator_restarted -> until the agents stated their copies step 5 was listed with its copies unknown and a load needing another's copy failed Unavailable (not LOST); then held and reloaded from memory, $(sum_sources memory_bytes) bytes"

# --- agents_killed ----------------------------------------------------------------------------
for r in 0 1 2 3; do kill -KILL "${AGENT_PIDS[$r]}"; done
for r in 0 1 2 3; do restart_agent "$r"; done
# Registered again, an agent counts as holding what it does not know yet ("copies unknown")
# until its first heartbeat says it holds nothing.
wait_until 30 listed 5 lost || fail "step 5 is not listed as lost: $(cat "$DIR/logs/checkpoints.json")"
"$CLI" checkpoints --coordinator="$COORD" "$JOB" >"$DIR/logs/checkpoints.txt" 2>&1 ||
  fail "tessera checkpoints failed"
grep -q "memory-only, LOST" "$DIR/logs/checkpoints.txt" ||
  fail "tessera checkpoints does not say step 5 is lost: $(cat "$DIR/logs/checkpoints.txt")"
grep -q "step 5: no live agent holds data-" "$DIR/logs/checkpoints.txt" ||
  fail "tessera checkpoints does not name the lost files: $(cat "$DIR/logs/checkpoints.txt")"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=load --load_step=5 "${MODEL[@]}" &&
  fail "step 5 loaded after every agent holding it was killed"
for r in 0 1 2 3; do
  grep -q "load: MEMORY_COPY_LOST: .*step 5 is a memory-only checkpoint and no live agent holds data-" \
    "$DIR/logs/trainer-$JOB-$r.out" ||
    fail "rank $r's load of step 5 did not fail with MEMORY_COPY_LOST naming the files: $(tail -n 2 "$DIR/logs/trainer-$JOB-$r.out")"
  grep -q "loaded step" "$DIR/logs/trainer-$JOB-$r.out" && fail "rank $r loaded something"
done
expect_latest_intact 4
echo "ok: agents_killed -> step 5 listed LOST and refused with MEMORY_COPY_LOST; step 4 loads from disk byte for byte"

# --- tier_disabled ----------------------------------------------------------------------------
for r in 0 1 2 3; do restart_agent "$r" --memory_tier=false; done
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=7 --persist_every=2 \
  --expect_error=MEMORY_ONLY_REFUSED "${MODEL[@]}" ||
  fail "a memory-only save with the memory tier off was not refused: $(tail -n 2 "$DIR/logs/trainer-$JOB-0.out")"
grep -q "runs with --memory_tier=false; nothing was staged" "$DIR/logs/trainer-$JOB-0.out" ||
  fail "the refusal does not say why: $(tail -n 2 "$DIR/logs/trainer-$JOB-0.out")"
[ "$(disk_steps)" = "2 4 " ] || fail "steps on disk: $(disk_steps), expected 2 and 4"
wait_until 30 listed 5 lost || fail "the refused save changed the listing: $(cat "$DIR/logs/checkpoints.json")"
echo "ok: tier_disabled -> MEMORY_ONLY_REFUSED before staging; step 4 stays latest"

# --- writer_frozen_before_keeping -------------------------------------------------------------
# Step 9 saved in memory only while rank 1's agent freezes (SIGSTOP) as COMMITTED reaches it,
# just before it keeps the step. Its heartbeats so far do not say it handled that commit, so
# while its lease runs (20 s here) the step is listed with its copies unknown — never LOST
# — though no agent states rank 1's file; resumed, it keeps the step and says so at once, and
# every rank reloads it from memory.
for r in 0 1 2 3; do
  if [ "$r" -eq 1 ]; then restart_agent "$r" --freeze_on=keep; else restart_agent "$r"; fi
done
restart_coordinator --lease_ms=20000 --heartbeat_interval_ms=1000
# Every agent heard since the coordinator started, and a lease passed since it recovered step
# 5 (noted again: these agents never say they handled it): "unknown" below is neither.
wait_until 45 listed 5 lost ||
  fail "step 5 is not listed as lost: $(cat "$DIR/logs/checkpoints.json")"
save_then_kill_trainers 9
wait_for_line "$DIR/logs/agent-$JOB-1.log" "fault injection: freezing on keep" 30 ||
  fail "agent 1 did not freeze as it was about to keep step 9"
listed 9 unknown || fail "step 9 is not listed with its copies unknown while its writer has" \
  "not kept it: $(cat "$DIR/logs/checkpoints.json")"
"$CLI" checkpoints --coordinator="$COORD" "$JOB" >"$DIR/logs/checkpoints.txt" 2>&1 ||
  fail "tessera checkpoints failed"
grep -q "memory-only, copies unknown" "$DIR/logs/checkpoints.txt" ||
  fail "tessera checkpoints does not say step 9's copies are unknown: $(cat "$DIR/logs/checkpoints.txt")"
grep -q "LOST" "$DIR/logs/checkpoints.txt" &&
  fail "step 9 is listed as lost: $(cat "$DIR/logs/checkpoints.txt")"
kill -CONT "${AGENT_PIDS[1]}"
wait_until 30 listed 9 memory ||
  fail "step 9 is not listed as held in memory after its writer resumed: $(cat "$DIR/logs/checkpoints.json")"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=load --load_step=-2 "${MODEL[@]}" ||
  fail "loading the newest commit failed: $(grep -h 'FAIL\|rror' "$DIR"/logs/trainer-"$JOB"-*.out | head -n 3)"
for r in 0 1 2 3; do
  grep -q "loaded step 9 " "$DIR/logs/trainer-$JOB-$r.out" || fail "rank $r did not load step 9"
done
[ "$(sum_sources disk_bytes)" -eq 0 ] || fail "$(sum_sources disk_bytes) bytes of step 9 came from disk"
echo "ok: writer_frozen_before_keeping -> step 9 listed with its copies unknown (not LOST)" \
  "while its writer had not kept it; resumed, held and reloaded from memory," \
  "$(sum_sources memory_bytes) bytes"

finish
echo "PASS"
