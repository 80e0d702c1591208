#!/usr/bin/env bash
# A relayed PIN that cannot reach its target (DESIGN.md "Relayed PINs", failure semantics).
# Real processes on loopback, tp=4 on one node, --relay_from=1: a cached save's PINs go to
# rank 0's agent alone, which passes them on to ranks 1-3 at their Peer ports. Rank 2's agent
# advertises a Peer address nothing listens on (--peer_host=127.0.0.2; it listens on
# 127.0.0.1), so the relay to it is refused. Asserted, for the cached save of step 20:
# - the relay passed the PIN on to the other two and reported rank 2 (Coordinator.RelayFailed);
# - the coordinator sent rank 2 its PIN on rank 2's own stream;
# - step 20 commits and the trainers load it byte for byte.
# Every phase deadline is 600 s: had the coordinator not sent rank 2's PIN itself, the save
# would sit in PINNING and the trainers would hit TRAINER_TIMEOUT (a hang, failing the test),
# not abort.
LAYOUT=tp=4
source tests/faults/lib.sh

COORD_LOG="$DIR/logs/coordinator.log"
start_coordinator --relay_from=1 --planning_timeout_s=600 --pinning_timeout_s=600 \
  --copying_timeout_s=600 --persisting_timeout_s=600 --committing_timeout_s=600 ||
  fail "coordinator"
start_agents "$JOB" "$LAYOUT" || fail "agents"
restart_agent 2 --peer_host=127.0.0.2
grep -q "peers on 127\.0\.0\.2:" "$DIR/logs/agent-$JOB-2.log" ||
  fail "rank 2's agent does not advertise 127.0.0.2: $(grep "peers on" "$DIR/logs/agent-$JOB-2.log" | tail -n 1)"

# Step 10 plans (its PINs carry assignments and are written to every stream); step 20 reuses
# the plan, and its PINs are relayed.
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10,20 "${MODEL[@]}" ||
  fail "saving steps 10 and 20: $(tail -n 3 "$DIR"/logs/trainer-"$JOB"-*.out)"
grep -q "(plan cached)" "$DIR/logs/trainer-$JOB-0.out" || fail "step 20 did not reuse the plan"
grep -q " commands handed to the streams in .* (1 written, 3 of them relayed by agents)" \
  "$COORD_LOG" || fail "step 20's PINs were not written once and relayed to three agents"

relay_log="$DIR/logs/agent-$JOB-0.log"
grep -Eq "relayed session .* to 3 agent\(s\) in .*: 1 failed \(first: rank 2 at 127\.0\.0\.2:" \
  "$relay_log" || fail "rank 0's agent did not log that the relay to rank 2 failed"
grep -q "reported 1 rank(s) the relay of session .* missed: the coordinator sends them the command" \
  "$relay_log" || fail "rank 0's agent did not report rank 2 to the coordinator"
grep -Eq "job $JOB: rank 0 could not relay session .*'s command to ranks 2; sent on their own streams to 2$" \
  "$COORD_LOG" || fail "the coordinator did not send rank 2 its PIN itself"
echo "   $(grep -E "relayed session .* failed" "$relay_log" | tail -n 1 | cut -c1-200)"
echo "   $(grep -E "could not relay session" "$COORD_LOG" | tail -n 1 | cut -c1-200)"

expect_committed_status relayed 20
expect_latest_intact 20
finish
echo "PASS: a relayed PIN its target could not take was reported and sent by the coordinator; step 20 committed and loads"
