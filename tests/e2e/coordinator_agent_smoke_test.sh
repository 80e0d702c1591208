#!/usr/bin/env bash
# End-to-end: real tessera-coordinator and tessera-agent processes on loopback.
# Asserts: the agent registers and heartbeats; after the coordinator is killed with -9 and
# restarted on the same port the agent registers again by itself; a second agent for the same
# job and rank on this host is refused, naming the first one's pid, and the first goes on;
# SIGTERM stops both with exit status 0 within a bound, leaving no ownership object behind.
# The trainer socket and the ownership object are mode 600: the user's alone.
set -uo pipefail
source deploy/lib/procs.sh

coordinator=server/tessera-coordinator
agent=agent/tessera-agent
dir=${TEST_TMPDIR:-$(mktemp -d)}
job="smoke$$"  # its staging is named by job and rank on this host: apart from other runs'
sock=$(mktemp -d /tmp/tessera-sock.XXXXXX)  # unix socket paths are limited to 107 bytes
trap 'rm -rf "$sock"' EXIT
fail() { echo "FAIL: $*"; echo "--- coordinator log"; cat "$dir"/coord*.log; echo "--- agent log"; cat "$dir/agent.log"; exit 1; }

"$coordinator" --listen=127.0.0.1:0 --db_path="$dir/db" --storage_root="$dir/ckpt" \
  --lease_ms=2000 --heartbeat_interval_ms=100 2>"$dir/coord1.log" &
cpid=$!
wait_for_line "$dir/coord1.log" "listening on" 20 || fail "coordinator did not start"
port=$(bound_port "$dir/coord1.log")
[ -n "$port" ] || fail "no port in the coordinator log"

"$agent" --coordinator="127.0.0.1:$port" --job="$job" --rank=1 --layout=tp=2,dp=2 \
  --socket="$sock/agent.sock" --peer_listen=127.0.0.1:0 2>"$dir/agent.log" &
apid=$!
wait_for_line "$dir/coord1.log" "registered agent job=$job rank=1" 20 || fail "no registration"
wait_for_line "$dir/agent.log" "lease renewed" 20 || fail "agent did not heartbeat"
# The trainer's endpoint and the staging claim are this user's alone.
[ "$(stat -c %a "$sock/agent.sock")" = 600 ] ||
  fail "the trainer socket is mode $(stat -c %a "$sock/agent.sock"), not 600"
[ "$(stat -c %a "/dev/shm/tessera-$job-r1.owner")" = 600 ] ||
  fail "the ownership object is mode $(stat -c %a "/dev/shm/tessera-$job-r1.owner"), not 600"

# Coordinator crash and restart on the same port: the agent must come back on its own.
kill -KILL "$cpid"; wait "$cpid" 2>/dev/null
"$coordinator" --listen="127.0.0.1:$port" --db_path="$dir/db" --storage_root="$dir/ckpt" \
  --lease_ms=2000 --heartbeat_interval_ms=100 2>"$dir/coord2.log" &
cpid=$!
wait_for_line "$dir/coord2.log" "registered agent job=$job rank=1" 30 ||
  fail "agent did not re-register after the coordinator restarted"
wait_for_line "$dir/agent.log" "lease renewed.*" 20 || fail "no heartbeat after restart"
until [ "$(count_lines "$dir/agent.log" "lease renewed")" -ge 2 ]; do
  sleep 0.1; kill -0 "$apid" 2>/dev/null || fail "agent died"
  [ $SECONDS -lt 120 ] || fail "no heartbeat after the restart"
done

# A second agent for the same job and rank refuses to start (it would own the same staging).
timeout 20 "$agent" --coordinator="127.0.0.1:$port" --job="$job" --rank=1 --layout=tp=2,dp=2 \
  --socket="$sock/agent2.sock" --peer_listen=127.0.0.1:0 2>"$dir/agent2.log"
rc2=$?
[ "$rc2" -eq 2 ] || fail "a second agent for $job rank 1 exited with $rc2, not 2: $(cat "$dir/agent2.log")"
grep -q "another agent (pid $apid) serves job $job rank 1" "$dir/agent2.log" ||
  fail "the refusal does not name the running agent: $(cat "$dir/agent2.log")"
kill -0 "$apid" 2>/dev/null || fail "the first agent died"

stop_process "$apid" 10; arc=$?
[ "$arc" -eq 0 ] || fail "agent exited with $arc on SIGTERM"
grep -Eq "stopping after [1-9][0-9]* heartbeats" "$dir/agent.log" || fail "no heartbeats counted"
[ -e "/dev/shm/tessera-$job-r1.owner" ] && fail "the agent left its ownership object in /dev/shm"
stop_process "$cpid" 10; crc=$?
[ "$crc" -eq 0 ] || fail "coordinator exited with $crc on SIGTERM"
grep -q "stopped" "$dir/coord2.log" || fail "coordinator did not log a clean stop"
echo "PASS: register, heartbeat, reconnect after coordinator restart, second agent refused, clean SIGTERM"
