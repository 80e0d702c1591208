#!/usr/bin/env bash
# The memory tier (issue 16), real processes on loopback, tp=2,dp=2 on one node (DESIGN.md
# "Memory tier"):
# - trainer_killed: every trainer SIGKILLed right after its save of step 20 returned, before
#   the commit; the agents outlive them, commit step 20 and keep it in memory; the restarted
#   trainers load it byte for byte, every byte from memory (their agent's and their node
#   peers'), none from disk;
# - flipped_byte: one byte of rank 0's memory copy flipped: its checksum block is caught and
#   read from disk by each trainer that reads it; every trainer still loads byte for byte;
# - tier_full: agents whose staging budget holds one save's staging but not two: saving step
#   40 drops step 30's memory copy; loading step 30 reads every byte from disk, byte for byte;
# - tier_disabled: agents with --memory_tier=false: nothing is kept, the load is a disk load.
source tests/faults/lib.sh
ulimit -c 0

COORD="127.0.0.1:0"  # set after start_coordinator

# agent_lines_count REGEX: lines of every agent log of the job matching REGEX.
agent_lines_count() { agent_logs | grep -Ec -- "$1"; }
# sum_sources FIELD: FIELD summed over every trainer's "load sources" line.
sum_sources() {
  cat "$DIR"/logs/trainer-"$JOB"-*.out | sed -nE "s/.*load sources:.* $1=([0-9]+).*/\1/p" |
    awk '{s += $1} END {print s + 0}'
}
# loaded_ranks: trainers that printed their load sources.
loaded_ranks() { cat "$DIR"/logs/trainer-"$JOB"-*.out | grep -c "load sources:"; }
# agents_json: the coordinator's view of the job's agents, in $DIR/logs/agents.json.
agents_json() { "$CLI" agents --json --coordinator="$COORD" "$JOB" >"$DIR/logs/agents.json" 2>/dev/null; }
# holding STEP: number of agents that told the coordinator they hold STEP in memory.
holding() {
  agents_json || { echo 0; return; }
  python3 - "$DIR/logs/agents.json" "$1" <<'EOF'
import json, sys
agents = json.load(open(sys.argv[1])).get("agents", [])
print(sum(1 for a in agents if a.get("resident", {}).get("step") == sys.argv[2]))
EOF
}
# data_files STEP: the data files of committed STEP (one per writing rank).
data_files() { ls "$(step_dir "$1")" | grep -c '\.safetensors$'; }
# held_by STEP N: exactly N agents hold STEP in memory.
held_by() { [ "$(holding "$1")" -eq "$2" ]; }
# wait_held STEP: every writer of STEP holds it in memory, as the coordinator knows (bounded).
wait_held() {
  local want
  want=$(data_files "$1")
  [ "$want" -gt 0 ] || fail "step $1 has no data files"
  wait_until 20 held_by "$1" "$want" ||
    fail "$(holding "$1") of $want writers of step $1 hold it in memory"
}
# is_latest STEP: STEP is the latest committed step.
is_latest() { [ "$(latest_step)" = "$(basename "$(step_dir "$1")")" ]; }
# wait_latest STEP: waits (bounded) until STEP is the latest committed step.
wait_latest() { wait_until 30 is_latest "$1" || fail "step $1 was not committed (latest: $(latest_step))"; }
# load_all STEP: every rank's trainer loads STEP (-1: the latest) and checks every byte.
load_all() {
  run_trainers_bounded "$JOB" "$LAYOUT" --mode=load --load_step="$1" "${MODEL[@]}" ||
    fail "loading step $1 failed: $(grep -h 'FAIL\|rror' "$DIR"/logs/trainer-"$JOB"-*.out | head -n 3)"
  [ "$(loaded_ranks)" -eq 4 ] || fail "only $(loaded_ranks) of 4 trainers reported their load"
}

metrics_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_coordinator --coordinator_commits=false --metrics_listen="127.0.0.1:$metrics_port" ||
  fail "coordinator"
COORD=$(coordinator_address)
start_agents "$JOB" "$LAYOUT" || fail "agents"

# --- trainer_killed ---------------------------------------------------------------------------
start_save 20 --kill_after_save
for r in 0 1 2 3; do
  wait_pid_bounded "${TRAINER_PIDS[$r]}" "$TRAINER_TIMEOUT" "trainer $r"
  [ "$WAITED_RC" -eq 137 ] || fail "trainer $r exited $WAITED_RC, not SIGKILLed after its save"
done
TRAINER_PIDS=()
wait_latest 20
wait_held 20
# What the agents hold is exported: tessera_memory_tier_bytes is the sum of their copies.
agents_json || fail "tessera agents"
python3 - "$metrics_port" "$JOB" "$DIR/logs/agents.json" <<'EOF' || fail "tessera_memory_tier_bytes"
import json, re, sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
m = re.search(r'^tessera_memory_tier_bytes\{job="%s"\} ([0-9.e+]+)$' % sys.argv[2], text, re.M)
assert m, "no tessera_memory_tier_bytes for the job in /metrics"
held = sum(int(a["resident"]["nbytes"]) for a in json.load(open(sys.argv[3]))["agents"]
           if "resident" in a)
assert held > 0 and float(m.group(1)) == held, (m.group(1), held)
EOF
load_all -1
grep -q "loaded step 20 " "$DIR/logs/trainer-$JOB-0.out" || fail "loaded the wrong step"
[ "$(sum_sources disk_bytes)" -eq 0 ] ||
  fail "$(sum_sources disk_bytes) bytes of step 20 came from disk, not memory"
[ "$(sum_sources memory_bytes)" -gt 0 ] || fail "nothing came from memory"
[ "$(sum_sources memory_blocks_rejected)" -eq 0 ] || fail "memory blocks rejected"
echo "ok: trainer_killed -> step 20 reloaded byte for byte, $(sum_sources memory_bytes) bytes from memory, 0 from disk"

# --- flipped_byte -----------------------------------------------------------------------------
agents_json || fail "tessera agents"
region=$(python3 -c 'import json,sys
for a in json.load(open(sys.argv[1]))["agents"]:
    if a["coord"].get("rank", 0) == 0: print(a["resident"]["region"])' "$DIR/logs/agents.json")
[ -n "$region" ] || fail "rank 0 holds nothing in memory"
[ -f "/dev/shm${region}" ] || fail "rank 0's memory copy /dev/shm${region} is missing"
# The region starts with rank 0's data section: its first chunk's body, 4 KiB-aligned.
python3 - "/dev/shm${region}" <<'EOF' || fail "could not flip a byte"
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(100)
    b = f.read(1)
    f.seek(100)
    f.write(bytes([b[0] ^ 0x5a]))
EOF
load_all -1
rejected=$(sum_sources memory_blocks_rejected)
# Rank 0's first chunk is a parameter piece of tp=0, which both data-parallel replicas load.
[ "$rejected" -eq 2 ] || fail "$rejected memory blocks rejected, expected 2 (one per replica reading it)"
[ "$(sum_sources disk_bytes)" -gt 0 ] || fail "the rejected blocks were not read from disk"
echo "ok: flipped_byte -> caught by checksum in $rejected loads, read from disk, byte for byte"

# --- tier_full --------------------------------------------------------------------------------
# A staging budget that holds every rank's staging region of one save, but not two: the
# regions of step 20 the agents logged, in whole MiB.
budget_mb=$(agent_logs | sed -nE 's/.*step 20 kept in memory: .*a region of ([0-9]+) bytes.*/\1/p' |
  python3 -c 'import math, sys
sizes = [int(x) for x in sys.stdin.read().split()]
mib = math.ceil(max(sizes) / 2**20)
print(mib if sizes and mib * 2**20 < 2 * min(sizes) else 0)')
[ "$budget_mb" -gt 0 ] || fail "no whole-MiB budget fits one staging region of step 20 but not two"
for r in 0 1 2 3; do restart_agent "$r" --staging_budget_mb="$budget_mb"; done
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=30 "${MODEL[@]}" || fail "save 30"
wait_held 30
drops=$(agent_lines_count "memory copy of the last committed step was dropped")
# Without dropping step 30's copy, step 40's staging would not fit and the save would fail.
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=40 "${MODEL[@]}" || fail "save 40"
[ "$(agent_lines_count "memory copy of the last committed step was dropped")" -eq $((drops + 4)) ] ||
  fail "not every agent dropped step 30's memory copy to stage step 40"
wait_held 40
[ "$(holding 30)" -eq 0 ] || fail "step 30 is still held in memory beside step 40"
load_all 30
grep -q "loaded step 30 " "$DIR/logs/trainer-$JOB-0.out" || fail "loaded the wrong step"
[ "$(sum_sources memory_bytes)" -eq 0 ] || fail "step 30 came from memory after it was dropped"
[ "$(sum_sources disk_bytes)" -gt 0 ] || fail "step 30 was not read from disk"
echo "ok: tier_full -> with ${budget_mb} MiB of staging per agent, step 30 dropped for step 40's save, loaded from disk byte for byte"

# --- tier_disabled ----------------------------------------------------------------------------
for r in 0 1 2 3; do restart_agent "$r" --memory_tier=false; done
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=50 "${MODEL[@]}" || fail "save 50"
wait_latest 50
[ "$(holding 50)" -eq 0 ] || fail "an agent with --memory_tier=false holds step 50"
load_all -1
grep -q "loaded step 50 " "$DIR/logs/trainer-$JOB-0.out" || fail "loaded the wrong step"
[ "$(sum_sources memory_bytes)" -eq 0 ] || fail "memory used with the tier disabled"
[ "$(sum_sources disk_bytes)" -gt 0 ] || fail "step 50 was not read from disk"
echo "ok: tier_disabled -> step 50 loaded from disk byte for byte"

finish
echo "PASS"
