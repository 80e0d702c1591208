#!/usr/bin/env bash
# A node lost, its rank restored by its trainer from the buddy's memory (DESIGN.md "Memory
# tier": fetched by the trainer), with real processes on loopback: a coordinator, two agents
# on nodes bud-n0 and bud-n1 (tp=2: each is the other's memory buddy), Python trainer ranks
# (tests/bench/bench_rank.py: 8 MiB each in four tensors). After two saves, once rank 1's
# copy of step 2 sits with its buddy, node bud-n1 is lost (its agent SIGKILLed); rank 1 starts
# again on bud-n2, a node that never held anything, and loads the latest step:
# - rank 1 byte for byte, every byte read by its trainer from rank 0's agent
#   (bytes_fetched_by_client = bytes_fetched_from_peers = its bytes), checked by it, none
#   from disk, its time fetching reported (fetch_seconds);
# - rank 0 byte for byte from its own agent's memory, nothing fetched.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
PYTHON=${TESSERA_PYTHON:?python_sh_test (bazel/python.bzl) sets it}
export PYTHONPATH="$PWD/client/python/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
trap stop_all EXIT
JOB=bud
LAYOUT=tp=2
fail() {
  echo "FAIL: $*"
  tail -n 20 "$DIR"/logs/*.out "$DIR"/logs/agent-*.log 2>/dev/null | tail -n 80
  exit 1
}
mkdir -p "$DIR/logs" "$DIR/out"

# ranks MODE [bench_rank.py flags...]: both trainer ranks, in parallel; non-zero if one failed.
ranks() {
  local mode=$1 r rc=0
  shift
  local pids=()
  for r in 0 1; do
    timeout -k 5 120 "$PYTHON" -P tests/bench/bench_rank.py "$mode" \
      --agent="$SOCK_DIR/$JOB-$r.sock" --rank="$r" --world=2 --mib=8 --tensor-mib=2 \
      --barrier="$DIR/barrier-$mode" --out="$DIR/out/$mode-$r.json" "$@" \
      >"$DIR/logs/$mode-$r.out" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || rc=1; done
  return $rc
}

place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=bud-n$1; }
start_coordinator || fail "coordinator"
start_agents "$JOB" "$LAYOUT" || fail "agents"
ranks save --steps=2 || fail "saving steps 1 and 2"
wait_for_line "$DIR/logs/agent-$JOB-1.log" "memory copy of step 2 .*sent to buddy" 60 ||
  fail "rank 1's copy of step 2 never reached its buddy"

kill -KILL "${AGENT_PIDS[1]}" 2>/dev/null
wait "${AGENT_PIDS[1]}" 2>/dev/null
place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=bud-n$(($1 == 0 ? 0 : 2)); }
mark_agent_log "$JOB" 1
start_agent "$JOB" "$LAYOUT" 1
wait_registered "$JOB" 1 || fail "rank 1's replacement on bud-n2 did not register"
echo "node bud-n1 lost; rank 1's agent started again on bud-n2"

ranks load --saved-world=2 || fail "loading the latest step"
"$PYTHON" - "$DIR/out" <<'PY' || fail "the loads (above)"
import json, os, sys
out = sys.argv[1]
bad = []
for rank in (0, 1):
    report = json.load(open(os.path.join(out, "load-%d.json" % rank)))
    s = report["sources"]
    print("rank %d: step %d, %s" % (rank, report["step"], s))
    if report["step"] != 2 or report["mismatched"]:
        bad.append("rank %d: step %d, tensors that differ: %s"
                   % (rank, report["step"], report["mismatched"]))
    if s["bytes_from_disk"] != 0 or s["bytes_from_memory"] != report["bytes"]:
        bad.append("rank %d: not every byte from memory: %s" % (rank, s))
    if s["bytes_verified_by_client"] != report["bytes"]:
        bad.append("rank %d: its trainer checked %d of %d bytes"
                   % (rank, s["bytes_verified_by_client"], report["bytes"]))
    fetched = s["bytes_fetched_by_client"]
    if rank == 1 and not (fetched == report["bytes"] and fetched == s["bytes_fetched_from_peers"]):
        bad.append("rank 1: its trainer read %d bytes from the buddy, the load %d from peers"
                   % (fetched, s["bytes_fetched_from_peers"]))
    if rank == 1 and not s["fetch_seconds"] > 0:
        bad.append("rank 1: its load reports no time fetching: %s" % s)
    if rank == 0 and (fetched or s["bytes_fetched_from_peers"] or s["fetch_seconds"]):
        bad.append("rank 0 fetched from another node: %s" % s)
sys.exit("\n".join(bad) if bad else 0)
PY
grep -q "client_fetches_from=" "$DIR/logs/agent-$JOB-1.log" ||
  fail "rank 1's agent did not name the copy for its trainer to read"
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: node bud-n1 lost; rank 1 restored on bud-n2 by its trainer from its buddy's memory," \
  "byte for byte, checked as it arrived; rank 0 from its own agent's memory"
