#!/usr/bin/env bash
# Partitions on simulated hosts (real processes; tests/hosts/lib.sh): the coordinator on host
# coord, the agents of a tp=2 job on hosts a (rank 0) and b (rank 1), each other's memory
# buddies; storage shared. Step 10 is saved first. Then, each during a save held in PERSISTING
# (--inject_storage_fault=hold_writes: the writers wait for the test, so the fault lands inside
# the save, not before it):
#   (i)  host b cut off from the coordinator both ways (blackhole routes on b and on coord),
#        while b still reaches its buddy host a;
#   (ii) the same in one direction only: the coordinator's packets to b are dropped, b's to the
#        coordinator arrive;
# each asserted as tests/faults assert a failed save (tests/faults/lib.sh): no trainer hangs
# (each runs under TRAINER_TIMEOUT; an exit by it fails the test); rank 0's trainer hears the
# abort (AGENT_LOST: rank 1's lease lapsed) and rank 1's, whose agent cannot reach the one who
# judges (agent/lease_keeper.h), ends at its own wait deadline (WAIT_S, DEADLINE_EXCEEDED);
# the save is ABORTED with the reason naming rank 1 in `tessera status`, nothing of its step is
# committed, and step 10 stays the latest, verifies and loads byte for byte once the partition
# heals. Decision 0045.
#   (iii) rank 1 moved to host d, which reaches everyone only through tessera-wire (5 % of
#        packets lost, 50 ms each way): a save and then a restore across that link. The save
#        either commits complete (`tessera verify`, COMMITTED in status) or fails with its
#        reason by the deadline (ABORTED in status, nothing committed); either way the restore
#        loads the latest committed step (20, or 10) byte for byte.
#
# Why not `tc netem`: kernels built without sch_netem (this project's CI machines among them)
# have no qdisc that delays or drops, and no iptables; routes cut links and tessera-wire
# (tests/hosts/wire_main.cc, over TUN devices) delays and drops packets. Waits are on events
# (log lines, process exits, `tessera status`), each bounded. Needs root and `ip netns`;
# elsewhere it SKIPS visibly (tests/skip.sh).
LEASE_MS=1500
TRAINER_TIMEOUT=30
WAIT_S=8  # the trainers' deadline for a commit during a partition (rank 0 hears the abort in ~2 s)
LAYOUT=tp=2
JOB=part$$
source tests/faults/lib.sh
source tests/skip.sh
HOSTS=(coord a b)
declare -A ADDR=([coord]=10.77.0.1 [a]=10.77.0.11 [b]=10.77.0.12 [d]=10.77.1.2)
source tests/hosts/lib.sh
mkdir -p "$DIR/logs"
make_hosts
# The checks' CLI runs on the coordinator's host.
CLI="$DIR/tessera-on-coord"
printf '#!/bin/sh\nexec ip netns exec %s %s "$@"\n' "$TAG-coord" "$PWD/client/cli/tessera" >"$CLI"
chmod +x "$CLI"
cli_coordinator() { echo "${ADDR[coord]}:$COORD_PORT"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

start_coordinator_on_coord --planning_timeout_s=10 --pinning_timeout_s=10 \
  --copying_timeout_s=10 --persisting_timeout_s=15 --committing_timeout_s=10
RANK_HOSTS=(a b)
start_agents "$JOB" "$LAYOUT" || fail "agents"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10 "${MODEL[@]}" || fail "saving step 10"
expect_committed_status baseline 10
echo "step 10 committed on hosts a and b"

# partitioned_save CASE STEP EXPECT0 EXPECT1 CUT...: a save of STEP by fresh agents whose
# writers are held; once both are held, the routes CUT ("FROM:TO" each) are cut and the writers
# let go. Every trainer must fail by its deadline (WAIT_S, its wait for the commit), rank r's
# error matching EXPECTr; then the partition heals and rank 1's agent registers again.
partitioned_save() {
  local name=$1 step=$2 release="$DIR/release-$1" cut r t0
  local expect=("$3" "$4")
  shift 4
  stop_agents || fail "$name: agents did not stop cleanly"
  start_agents "$JOB" "$LAYOUT" --inject_storage_fault="hold_writes=$release" || fail "$name: agents"
  start_save "$step" --wait_timeout_s="$WAIT_S"
  for r in 0 1; do
    wait_for_line "$DIR/logs/agent-$JOB-$r.log" "fault injection: holding writes until" 30 ||
      fail "$name: rank $r's writers were not held in PERSISTING"
  done
  for cut in "$@"; do cut_route "${cut%:*}" "${cut#*:}"; done
  # Host b still reaches its buddy host a (rank 0's peer port there).
  reaches b "${ADDR[a]}" "$(ip netns exec "$TAG-a" ss -Hltn | awk 'NR == 1 {sub(/.*:/, "", $4); print $4}')" ||
    fail "$name: host b cannot reach host a: the partition is not b | coord alone"
  mark_agent_log "$JOB" 1
  t0=$(now_ms)
  touch "$release"
  for r in 0 1; do
    wait_pid_bounded "${TRAINER_PIDS[$r]}" "$TRAINER_TIMEOUT" "$name: trainer $r"
    [ "$WAITED_RC" -ne 124 ] || fail "$name: trainer $r hung (killed after ${TRAINER_TIMEOUT}s)"
    [ "$WAITED_RC" -ne 0 ] || fail "$name: trainer $r's save of step $step succeeded across the partition"
    grep -Eq -- "step $step: ${expect[$r]}" "$DIR/logs/trainer-$JOB-$r.out" ||
      fail "$name: trainer $r did not fail with /${expect[$r]}/: $(tail -n 1 "$DIR/logs/trainer-$JOB-$r.out")"
    echo "   $name: trainer $r ended $(($(now_ms) - t0)) ms after the cut:" \
      "$(grep -E "step $step: " "$DIR/logs/trainer-$JOB-$r.out" | tail -n 1 | cut -c1-130)"
  done
  TRAINER_PIDS=()
  for cut in "$@"; do heal_route "${cut%:*}" "${cut#*:}"; done
  wait_registered "$JOB" 1 || fail "$name: rank 1's agent did not register again after the partition healed"
}

# ---- (i) host b cut off from the coordinator, not from host a --------------------------------
# Rank 0 hears the abort: rank 1's agent was lost (no heartbeat within the lease). Rank 1's
# agent cannot know the outcome — only the coordinator judges leases (agent/lease_keeper.h) —
# so its trainer's wait ends at its own deadline, DEADLINE_EXCEEDED, not with a guess.
partitioned_save cut 11 "ABORTED: lost the agent of rank 1" "DEADLINE_EXCEEDED" b:coord coord:b
expect_aborted_status cut AGENT_LOST "rank 1"
expect_not_committed 11
expect_latest_intact 10

# ---- (ii) asymmetric: the coordinator's packets to host b are lost, b's arrive ---------------
partitioned_save asymmetric 12 "ABORTED: lost the agent of rank 1" "DEADLINE_EXCEEDED" coord:b
expect_aborted_status asymmetric AGENT_LOST "rank 1"
expect_not_committed 12
expect_latest_intact 10
stop_agents || fail "agents did not stop cleanly"

# ---- (iii) 5 % loss and 50 ms each way on host d's link, a save and a restore ----------------
# Rank 1 moves to host d, which reaches everyone through tessera-wire only.
join_through_wire d 50 5
RANK_HOSTS=(a d)
start_agents "$JOB" "$LAYOUT" || fail "agents on hosts a and d (through the wire)"
t0=$(now_ms)
if run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=20 "${MODEL[@]}"; then
  expect_committed_status lossy_save 20
  "$CLI" verify "$(step_dir 20)" >"$DIR/logs/verify-20.out" 2>&1 ||
    fail "lossy save: step 20 committed but does not verify: $(cat "$DIR/logs/verify-20.out")"
  echo "   lossy save: step 20 committed and verified in $(($(now_ms) - t0)) ms"
  latest=20
else
  status_json "$JOB" >"$DIR/logs/status-lossy.json" 2>&1 || fail "lossy save: tessera status failed"
  [ "$(status_field "$DIR/logs/status-lossy.json" 's["state"]')" = SESSION_STATE_ABORTED ] ||
    fail "lossy save: the trainers failed but the save is not ABORTED: $(cat "$DIR/logs/status-lossy.json")"
  [ -n "$(status_field "$DIR/logs/status-lossy.json" 's["error"]["message"]')" ] ||
    fail "lossy save: ABORTED without a reason"
  expect_not_committed 20
  echo "   lossy save: failed in $(($(now_ms) - t0)) ms: $(status_field "$DIR/logs/status-lossy.json" 's["error"]["message"]')"
  latest=10
fi
# The restore, across the same link: the latest committed step, byte for byte.
t0=$(now_ms)
expect_latest_intact "$latest"
echo "   lossy restore: step $latest loaded byte for byte on hosts a and d in $(($(now_ms) - t0)) ms"
finish
stop_wires
wire=$(grep -h "tessera-wire: stopped" "$DIR/logs/wire-d.log")
echo "$wire"
# The link was lossy indeed: it dropped packets and delivered the rest.
echo "$wire" | grep -Eq ": [1-9][0-9]* delivered, [1-9][0-9]* dropped" ||
  fail "the wire did not both deliver and drop packets: $wire"
if [ "$latest" = 20 ]; then outcome="committed and verified"; else outcome="failed with its reason"; fi
echo "PASS: host b cut off from the coordinator (both ways, and one way) during a save: aborted" \
  "by the deadline with the reason, nothing committed, step 10 still latest and loadable;" \
  "5 % loss and 50 ms on host d's link: the save $outcome, step $latest restored byte for byte"
