#!/usr/bin/env bash
# End-to-end: the coordinator with TLS, mutual TLS and an admin token (real processes).
# - an agent with the CA and a client certificate registers;
# - an agent without a client certificate, and a plaintext agent, are refused: each has tried
#   twice (its TLS handshake failed, as the coordinator logs), and neither registered;
# - the CLI needs the token: without it the coordinator answers UNAUTHENTICATED.
set -uo pipefail
source deploy/lib/procs.sh
dir=${TEST_TMPDIR:-$(mktemp -d)}
sock=$(mktemp -d /tmp/tessera-sock.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$sock"; rm -f /dev/shm/tessera-"${job:-}"-*; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -n 5 "$dir"/*.log; exit 1; }

# A CA, a server certificate for 127.0.0.1 and a client certificate.
cd "$dir"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=tessera-test-ca" 2>/dev/null || fail "CA"
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext 2>/dev/null || fail "server cert"
openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=agent" 2>/dev/null
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 2>/dev/null || fail "client cert"
cd - >/dev/null

server/tessera-coordinator --listen=127.0.0.1:0 --db_path="$dir/db" --storage_root="$dir/ckpt" \
  --tls_cert="$dir/server.pem" --tls_key="$dir/server.key" --tls_client_ca="$dir/ca.pem" \
  --admin_token=s3cret --lease_ms=2000 --heartbeat_interval_ms=200 2>"$dir/coordinator.log" &
pids+=($!)
wait_for_line "$dir/coordinator.log" "listening on" 20 || fail "coordinator did not start"
port=$(bound_port "$dir/coordinator.log")

# Unique per run: an agent holds /dev/shm/tessera-<job>-r<rank>.owner, so two runs on one
# host (bazel --runs_per_test) must not share a job id.
job=tls$$

agent() {  # agent RANK LOG [tls flags...]
  local rank=$1 log=$2; shift 2
  agent/tessera-agent --coordinator="127.0.0.1:$port" --job="$job" --rank="$rank" --layout=dp=4 \
    --socket="$sock/$rank.sock" --peer_listen=127.0.0.1:0 "$@" 2>"$dir/$log" &
  pids+=($!)
}
agent 0 agent-mtls.log --tls_ca="$dir/ca.pem" --tls_cert="$dir/client.pem" --tls_key="$dir/client.key"
agent 1 agent-nocert.log --tls_ca="$dir/ca.pem"
agent 2 agent-plain.log
wait_for_line "$dir/agent-mtls.log" "lease renewed" 20 || fail "the mTLS agent did not register"
# The refused agents have tried, and been refused, at least twice each: the coordinator's TLS
# layer (gRPC) logs each failed handshake with its reason — a client without a certificate
# ("peer did not return a certificate"), a plaintext client ("wrong version number").
nocert_refused="Handshake failed.*peer did not return a certificate"
plain_refused="Handshake failed.*wrong version number"
refused_twice() {
  [ "$(count_lines "$dir/coordinator.log" "$nocert_refused")" -ge 2 ] &&
    [ "$(count_lines "$dir/coordinator.log" "$plain_refused")" -ge 2 ]
}
wait_until 30 refused_twice ||
  fail "the coordinator did not refuse the agents without a client certificate and without TLS twice each within 30 s"
grep -q "registered agent job=$job rank=1" "$dir/coordinator.log" && fail "an agent without a client certificate registered"
grep -q "registered agent job=$job rank=2" "$dir/coordinator.log" && fail "a plaintext agent registered"
grep -q "lease renewed" "$dir/agent-nocert.log" && fail "the agent without a client certificate got a lease"

tls=(--coordinator="127.0.0.1:$port" --tls_ca="$dir/ca.pem" --tls_cert="$dir/client.pem" --tls_key="$dir/client.key")
client/cli/tessera jobs "${tls[@]}" --token=s3cret >"$dir/jobs.out" 2>&1 || fail "tessera jobs with the token: $(cat "$dir/jobs.out")"
grep -q "$job" "$dir/jobs.out" || fail "tessera jobs does not list the job"
if client/cli/tessera jobs "${tls[@]}" >"$dir/jobs-notoken.out" 2>&1; then fail "tessera jobs worked without the token"; fi
grep -qi "token" "$dir/jobs-notoken.out" || fail "the error does not mention the token: $(cat "$dir/jobs-notoken.out")"
echo "PASS: mTLS agent registered; agents without a client certificate or TLS refused; admin token enforced"
