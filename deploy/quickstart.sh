#!/usr/bin/env bash
# Tessera quick start: installs what is missing, builds, and runs a coordinator with an agent
# on loopback, showing that they talk. Stops everything it started; exits 0 only if all held.
#
#   ./deploy/quickstart.sh
#
# Environment:
#   TESSERA_DEMO_DIR   where logs (and later RocksDB and checkpoints) go (default ./tessera-demo)
#   TESSERA_DEMO_PORT  coordinator port (default: a free one)
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/lib/procs.sh

./deploy/install-deps.sh
echo "== building (bazel build //...)"
bazel build //... 2>&1 | tail -n 2
bin=$(bazel info bazel-bin 2>/dev/null)

demo=${TESSERA_DEMO_DIR:-./tessera-demo}
mkdir -p "$demo/logs"
pids=()
cleanup() { for p in "${pids[@]}"; do stop_process "$p" 10 || true; done; }
trap cleanup EXIT

echo "== starting tessera-coordinator"
"$bin/server/tessera-coordinator" --listen="127.0.0.1:${TESSERA_DEMO_PORT:-0}" \
  --lease_ms=3000 --heartbeat_interval_ms=500 2>"$demo/logs/coordinator.log" &
pids+=($!)
wait_for_line "$demo/logs/coordinator.log" "listening on" 30
port=$(bound_port "$demo/logs/coordinator.log")
echo "   listening on 127.0.0.1:$port"

echo "== starting tessera-agent (job demo, rank 0 of pp=1,tp=1,dp=1)"
"$bin/agent/tessera-agent" --coordinator="127.0.0.1:$port" --job=demo --rank=0 \
  --layout=pp=1,tp=1,dp=1 2>"$demo/logs/agent-0.log" &
pids+=($!)
wait_for_line "$demo/logs/coordinator.log" "registered agent job=demo rank=0" 30
wait_for_line "$demo/logs/agent-0.log" "lease renewed" 30
grep -h "registered\|lease renewed" "$demo/logs/coordinator.log" "$demo/logs/agent-0.log" |
  sed 's/^/   /'

echo "== stopping (SIGTERM)"
status=0
stop_process "${pids[1]}" 10 || status=$?
stop_process "${pids[0]}" 10 || status=$?
pids=()
if [ "$status" -ne 0 ]; then
  echo "quickstart: a process did not stop cleanly (status $status); logs in $demo/logs" >&2
  exit 1
fi
echo "== done: coordinator and agent registered, heartbeated and stopped cleanly."
echo "   logs: $demo/logs"
