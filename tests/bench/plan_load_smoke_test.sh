#!/usr/bin/env bash
# The planning benchmark's load tool (tessera-plan-load) against a real tessera-coordinator on
# loopback, at 8 ranks: what tests/bench/run.sh's figure 5 relies on, so that a change to the
# protocol or to the tool breaks here and not in the next reference run. Asserts, both with
# fingerprints and with agents re-sending whole plans: the tool exits 0 (save 1 committed
# through the fake agents' hashes and writes, save 2 pinned); every PIN of save 2 said
# plan_cached, and left the assignment out exactly when agents sent fingerprints; the committed
# manifest's load and write were timed.
set -uo pipefail
source deploy/lib/procs.sh

coordinator=server/tessera-coordinator
load=tests/bench/tessera-plan-load
dir=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; echo "--- coordinator log"; cat "$dir"/coord-*.log; exit 1; }

# run_tool NAME FINGERPRINTS: a fresh coordinator, then the tool; its JSON in $dir/NAME.json.
run_tool() {
  local name=$1 fingerprints=$2 cpid port
  "$coordinator" --listen=127.0.0.1:0 --db_path="$dir/db-$name" --storage_root="$dir/ckpt-$name" \
    --lease_ms=60000 --heartbeat_interval_ms=1000 2>"$dir/coord-$name.log" &
  cpid=$!
  wait_for_line "$dir/coord-$name.log" "listening on" 20 || fail "$name: coordinator did not start"
  port=$(bound_port "$dir/coord-$name.log")
  "$load" --coordinator="127.0.0.1:$port" --coordinator_pid="$cpid" --pp=2 --tp=2 --dp=2 \
    --shards_per_rank=12 --processes=2 --threads=2 --channels=2 --timeout_s=60 \
    --fingerprints="$fingerprints" >"$dir/$name.json" 2>"$dir/$name.log"
  local rc=$?
  stop_process "$cpid" 10 >/dev/null
  [ "$rc" -eq 0 ] || fail "$name: tessera-plan-load exited with $rc: $(cat "$dir/$name.log")"
}

# check NAME PYTHON_EXPRESSION: the expression over the tool's JSON (as d) holds.
check() {
  /usr/bin/python3 -c "import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if $2 else 1)" \
    "$dir/$1.json" || fail "$1: $2 does not hold: $(cat "$dir/$1.json")"
}

run_tool fingerprints true
check fingerprints 'd["ok"] and d["ranks"] == 8 and d["shards_per_rank"] == 12'
check fingerprints 'd["cached_pins"] == 8 and d["pins_without_assignment"] == 8'
check fingerprints 'd["full_plans_asked_cached"] == 0'
check fingerprints 'd["manifest_chunks"] > 0 and d["manifest_load_s"] > 0 and d["manifest_write_s"] > 0'
check fingerprints '0 < d["first_plan_s"] < 60 and 0 < d["cached_plan_s"] < 60'
ls "$dir"/ckpt-fingerprints/planbench/*.manifest-write-* >/dev/null 2>&1 &&
  fail "the manifest write's scratch directories were left behind"

run_tool whole false
check whole 'd["ok"] and d["cached_pins"] == 8 and d["pins_without_assignment"] == 0'
echo "PASS: the planning load tool against a real coordinator, with fingerprints and whole plans"
