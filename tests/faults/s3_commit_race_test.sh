#!/usr/bin/env bash
# Two committers racing one step on an object store (issue 48; decision 0041): two deployments,
# each a coordinator with a state of its own and agents of its own, save the same job's step 10
# into the same s3:// root, as after a failover that left the old coordinator running. Each
# checks that the step has no manifest and then PUTs its own with If-None-Match: *. The S3
# proxy (s3_fault_proxy.py's rendezvous) holds the first manifest PUT until the second arrives
# and sends both on together, so both checks are behind them and the server alone decides.
# Asserts: exactly one save commits, the other aborts with STEP_EXISTS naming the winner's
# session; the step verifies and
# its manifest names the winner's session; the loser's save left no manifest of its own.
#
# Both deployments' agents serve job "race" on this one machine, and an agent's staging and its
# ownership claim live in /dev/shm under the job's name: the second deployment's agents and
# trainers run in a mount namespace with a /dev/shm of its own, as on a host of its own. That
# needs root and unshare/nsenter; where the machine refuses, the test SKIPS visibly
# (tests/skip.sh).
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
source tests/skip.sh
BIN=.
CLI="$BIN/client/cli/tessera"
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=3000
LAYOUT=tp=1,dp=2
PROXY_PID="" SHM_NS_PID=""
cleanup() {
  [ -z "$PROXY_PID" ] || kill "$PROXY_PID" 2>/dev/null
  [ -z "$SHM_NS_PID" ] || kill "$SHM_NS_PID" 2>/dev/null
  stop_all
}
trap cleanup EXIT
mkdir -p "$DIR/logs"

# A mount namespace whose /dev/shm is a tmpfs of its own. Its process only holds the namespace
# open for nsenter (no test waits on it: readiness is the file it touches, awaited below); the
# sleep's hour is a bound, and cleanup kills it.
[ "$(id -u)" -eq 0 ] || skip "a /dev/shm of the second deployment's own needs root (uid $(id -u))"
for tool in unshare nsenter mount; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (util-linux)"
done
unshare --mount --propagation private sh -c \
  'mount -t tmpfs -o size=1g tmpfs /dev/shm && touch "$0" && exec sleep 3600' "$DIR/shm-ns.ready" \
  2>"$DIR/logs/shm-ns.log" &
SHM_NS_PID=$!
wait_until 10 test -e "$DIR/shm-ns.ready" ||
  skip "no mount namespace with a /dev/shm of its own here: $(cat "$DIR/logs/shm-ns.log")"

start_local_s3 tessera || fail "S3 server"
/usr/bin/python3 tests/faults/s3_fault_proxy.py "$AWS_ENDPOINT_URL" "$DIR/proxy.port" \
  "$DIR/proxy.fail" 2>>"$DIR/logs/proxy.log" &
PROXY_PID=$!
wait_until 20 test -s "$DIR/proxy.port" || fail "the proxy did not start"
export AWS_ENDPOINT_URL="http://127.0.0.1:$(cat "$DIR/proxy.port")"
step10="$STORAGE_ROOT/race/step-000000010"
echo "2 ^PUT /tessera/ckpt/race/step-000000010/manifest\.pb$" >"$DIR/proxy.fail.hold"

# deployment NAME [WRAP...]: a coordinator, agents and trainers of their own in $DIR/NAME (the
# agents and trainers under WRAP), saving job race's step 10; exits as its trainers did.
deployment() {
  local name=$1; shift
  DIR=$DIR/$name SOCK_DIR=$(mktemp -d /tmp/tessera-sock.XXXXXX)
  COORD_PID="" COORD_PORT="" LOCAL_S3_PID="" PROXY_PID="" SHM_NS_PID=""
  RACE_WRAP=("$@")
  place_rank() { PLACE_WRAP=("${RACE_WRAP[@]}"); PLACE_ADDR=127.0.0.1; PLACE_NODE=""; }
  trap stop_all EXIT
  start_coordinator || exit 2
  start_agents race "$LAYOUT" || exit 2
  run_trainers race "$LAYOUT" --mode=save --steps=10
}
(deployment a) &
racer_a=$!
(deployment b nsenter -t "$SHM_NS_PID" -m --wd="$PWD") &
racer_b=$!
wait "$racer_a"; rc_a=$?
wait "$racer_b"; rc_b=$?

held=$(grep -c "^PUT" "$DIR/proxy.fail.held" 2>/dev/null)
grep -q timeout "$DIR/proxy.fail.held" 2>/dev/null && fail "the manifest PUTs did not meet (held: $held)"
[ "$held" = 2 ] || fail "the proxy held ${held:-no} manifest PUTs, not 2"
case "$rc_a$rc_b" in
  01) winner=a loser=b ;;
  10) winner=b loser=a ;;
  *) FAIL_TAIL=5 DIR=$DIR/a fail "the racing saves exited $rc_a and $rc_b: exactly one must commit" ;;
esac
grep -q "step 10 committed at $step10" "$DIR/$winner/logs/trainer-race-0.out" ||
  fail "the winner ($winner) does not say it committed step 10"
session=$(sed -n 's/.*session \(s10-[0-9a-f]*\) (step 10) committed at .*/\1/p' \
  "$DIR/$winner/logs/agent-race-0.log" | head -n 1)
[ -n "$session" ] || fail "the winner's agent log names no committed session"
grep -q "cannot commit to $step10: it is already committed by session $session" \
  "$DIR/$loser/logs/trainer-race-0.out" ||
  fail "the loser's ($loser) abort does not name the winner's commit: $(tail -n 1 "$DIR/$loser/logs/trainer-race-0.out")"
grep -q "STEP_EXISTS: cannot commit to $step10" "$DIR/$loser/logs/coordinator.log" ||
  fail "the loser's coordinator does not log STEP_EXISTS"
"$CLI" verify "$step10" >"$DIR/logs/verify.out" 2>&1 ||
  fail "the raced step 10 does not verify: $(cat "$DIR/logs/verify.out")"
"$CLI" inspect "$step10" --json >"$DIR/logs/inspect.json" 2>&1 || fail "tessera inspect $step10"
grep -q "\"session_id\": *\"$session\"" "$DIR/logs/inspect.json" ||
  fail "the manifest is not the winner's session $session: $(grep session_id "$DIR/logs/inspect.json")"
echo "PASS: two deployments raced step 10's commit on S3: $winner committed (session $session)," \
  "$loser aborted with STEP_EXISTS; the step verifies and is the winner's"
