#!/usr/bin/env bash
# Faults of an object store under real saves (issue 48): SeaweedFS on loopback behind a proxy
# that can answer 503 SlowDown (s3_fault_proxy.py), the coordinator with an s3:// root.
#   1. a burst of 503s during a save: the save commits (the client retries with backoff);
#   2. the S3 server killed (SIGKILL) while the agents upload: the save aborts naming the
#      object store, no manifest of it exists, and the previous latest verifies and loads;
#   3. an agent with refused credentials: the save aborts naming the refusal, nothing written;
#      a coordinator with refused credentials, or a bucket that does not exist, refuses to
#      start, saying so and never showing the secret.
# Two committers racing one step: s3_commit_race_test.sh.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
CLI="$BIN/client/cli/tessera"
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=3000
LAYOUT=tp=1,dp=2
PROXY_PID=""
cleanup() {
  [ -z "$PROXY_PID" ] || kill "$PROXY_PID" 2>/dev/null
  stop_all
}
trap cleanup EXIT

start_local_s3 tessera || fail "S3 server"
# Every process reaches S3 through the proxy.
/usr/bin/python3 tests/faults/s3_fault_proxy.py "$AWS_ENDPOINT_URL" "$DIR/proxy.port" \
  "$DIR/proxy.fail" 2>>"$DIR/logs/proxy.log" &
PROXY_PID=$!
wait_until 20 test -s "$DIR/proxy.port" || fail "the proxy did not start"
export AWS_ENDPOINT_URL="http://127.0.0.1:$(cat "$DIR/proxy.port")"
start_coordinator --keep_last=3 || fail "coordinator"

verify() { "$CLI" verify "$STORAGE_ROOT/$1/step-$(printf %09d "$2")" >"$DIR/logs/verify.out" 2>&1; }

# --- 1. A burst of 503s --------------------------------------------------------------------
# Four answers of 503 in a row: even all on one request, its fifth attempt goes through.
start_agents slow "$LAYOUT" || fail "agents (slow)"
echo 4 >"$DIR/proxy.fail"
run_trainers slow "$LAYOUT" --mode=save --steps=10 || fail "a save under 503s did not commit"
grep -q "step 10 committed" "$DIR/logs/trainer-slow-0.out" || fail "no commit under 503s"
[ "$(wc -l <"$DIR/proxy.fail.served")" -eq 4 ] || fail "the proxy served $(wc -l <"$DIR/proxy.fail.served") 503s, not 4"
verify slow 10 || fail "step 10 saved under 503s does not verify: $(cat "$DIR/logs/verify.out")"
stop_agents || fail "agents (slow) did not stop cleanly"
echo "   1. 4 x 503 SlowDown during a save: committed, verified"

# --- 2. The S3 server killed while the agents upload ---------------------------------------
touch "$DIR/release"
start_agents kill "$LAYOUT" --inject_storage_fault="hold_writes=$DIR/release" ||
  fail "agents (kill)"
run_trainers kill "$LAYOUT" --mode=save --steps=10 || fail "the first save (kill) did not commit"
rm "$DIR/release"
run_trainers kill "$LAYOUT" --mode=save --steps=20 &
saving=$!
for r in 0 1; do
  wait_for_line "$DIR/logs/agent-kill-$r.log" "fault injection: holding writes" 60 ||
    fail "agent $r never reached its writes"
done
kill -USR1 "$LOCAL_S3_PID"
wait_until 30 grep -qx down "$DIR/local-s3.env.state" || fail "S3 was not killed"
touch "$DIR/release"
wait "$saving" && fail "step 20 committed with the S3 server dead"
grep -h "step 20" "$DIR"/logs/trainer-kill-*.out | head -n 2
grep -q "s3://tessera/ckpt/kill/step-000000020" "$DIR"/logs/trainer-kill-*.out ||
  fail "the abort does not name the object store's path"
kill -USR2 "$LOCAL_S3_PID"
wait_until 90 grep -q "^up" "$DIR/local-s3.env.state" || fail "S3 did not come back"
verify kill 20 && fail "step 20 has a manifest: an aborted save was committed"
verify kill 10 || fail "the previous latest (step 10) does not verify: $(cat "$DIR/logs/verify.out")"
run_trainers kill "$LAYOUT" --mode=load --load_step=-1 || fail "loading the latest after the kill"
grep -q "loaded step 10" "$DIR/logs/trainer-kill-0.out" || fail "latest is not step 10"
stop_agents || fail "agents (kill) did not stop cleanly"
echo "   2. S3 killed during the uploads: the save aborted naming it; step 10 still latest, verified, loaded"

# --- 3. Refused credentials, a missing bucket ----------------------------------------------
secret=$AWS_SECRET_ACCESS_KEY
AWS_SECRET_ACCESS_KEY=not-the-secret start_agents creds "$LAYOUT" || fail "agents (creds)"
run_trainers creds "$LAYOUT" --mode=save --steps=10 && fail "a save with refused credentials committed"
grep -qiE "PERMISSION_DENIED|SignatureDoesNotMatch|AccessDenied" "$DIR"/logs/trainer-creds-*.out ||
  fail "the abort does not say the credentials were refused: $(tail -n 2 "$DIR/logs/trainer-creds-0.out")"
grep -q -- "$secret\|not-the-secret" "$DIR"/logs/trainer-creds-*.out "$DIR"/logs/agent-creds-*.log &&
  fail "a secret appears in a message"
verify creds 10 && fail "a save with refused credentials left a checkpoint"
stop_agents || fail "agents (creds) did not stop cleanly"
for case in "bucket s3://no-such-bucket/ckpt $secret" "secret s3://tessera/ckpt not-the-secret"; do
  read -r what root key <<<"$case"
  AWS_SECRET_ACCESS_KEY=$key "$BIN/server/tessera-coordinator" --listen=127.0.0.1:0 \
    --db_path="$DIR/db-$what" --storage_root="$root" >"$DIR/logs/coord-$what.out" 2>&1 &&
    fail "a coordinator with a bad $what started"
  grep -q "cannot be reached" "$DIR/logs/coord-$what.out" ||
    fail "the coordinator's refusal ($what) is unclear: $(cat "$DIR/logs/coord-$what.out")"
  grep -q -- "$key" "$DIR/logs/coord-$what.out" &&
    fail "a secret appears in the coordinator's message ($what)"
done
grep -q "no-such-bucket" "$DIR/logs/coord-bucket.out" || fail "the missing bucket is not named"
echo "   3. refused credentials: save aborted, nothing written; bad bucket or secret: the coordinator refused to start"

stop_coordinator || fail "coordinator did not stop cleanly"

echo "PASS: S3 faults: 503 burst committed; S3 killed mid-upload aborted cleanly; refused credentials and a missing bucket said clearly"
