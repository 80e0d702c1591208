#!/usr/bin/env bash
# The planning benchmark's load tool (tessera-plan-load) against a real tessera-coordinator on
# loopback, at 8 ranks: what tests/bench/run.sh's figure 5 relies on, so that a change to the
# protocol or to the tool breaks here and not in the next reference run. Asserts, both with
# fingerprints and with agents re-sending whole plans: the tool exits 0 (save 1 committed
# through the fake agents' hashes and writes, save 2 pinned); every PIN of save 2 said
# plan_cached, and left the assignment out exactly when agents sent fingerprints; the committed
# manifest's load and write were timed. Then the same at 1,024 ranks with the coordinator
# handing each fan-out out on 4 threads (server/hand_out.h): every phase of save 1 went out
# that way, the save still committed with every rank's hashes and writes, and save 2's cached
# PINs were written once per node of 8 and relayed by the fake agents (server/relay.h). And
# at 8 ranks with relays from any fan-out size: save 1's PINs (with assignments) went to every
# rank, save 2's to one rank that passed them on to 7.
set -uo pipefail
source deploy/lib/procs.sh
work=${TEST_TMPDIR:-$(mktemp -d)}
SOCK_DIR=$work  # no agent runs here: no socket is made
source deploy/lib/cluster.sh
source tests/bench/plan_run.sh

BIN=.
fail() { echo "FAIL: $*"; echo "--- coordinator log"; cat "$work"/logs/plan-coordinator-*.log; exit 1; }

# run_tool NAME FINGERPRINTS [PP TP DP SHARDS]: one planning run as the benchmark makes it
# (plan_run: a fresh coordinator, then the tool; 2 x 2 x 2 ranks of 12 shards unless given);
# its JSON in $work/raw/plan-NAME.json, its work dir $work/NAME.
run_tool() {
  DIR=$work/$1
  plan_run "$1" "${3:-2}" "${4:-2}" "${5:-2}" "${6:-12}" "$2" 120 "$work/raw" "$work/logs" \
    --processes=2 --threads=2 --channels=2 --timeout_s=60 ||
    fail "$1: $(cat "$work/logs/plan-load-$1.log")"
  grep -q "plan validated" "$work/raw/plan-events-$1.txt" ||
    fail "$1: the coordinator's planning lines were not kept: $(cat "$work/raw/plan-events-$1.txt")"
}

# check NAME PYTHON_EXPRESSION: the expression over the tool's JSON (as d) holds.
check() {
  /usr/bin/python3 -c "import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if $2 else 1)" \
    "$work/raw/plan-$1.json" || fail "$1: $2 does not hold: $(cat "$work/raw/plan-$1.json")"
}

run_tool fingerprints true
check fingerprints 'd["ok"] and d["ranks"] == 8 and d["shards_per_rank"] == 12'
check fingerprints 'd["cached_pins"] == 8 and d["pins_without_assignment"] == 8'
check fingerprints 'd["full_plans_asked_cached"] == 0'
check fingerprints 'd["manifest_chunks"] > 0 and d["manifest_load_s"] > 0 and d["manifest_write_s"] > 0'
check fingerprints '0 < d["first_plan_s"] < 60 and 0 < d["cached_plan_s"] < 60'
ls "$work"/fingerprints/ckpt/planbench/*.manifest-write-* >/dev/null 2>&1 &&
  fail "the manifest write's scratch directories were left behind"

TESSERA_BENCH_PLAN_COORD_FLAGS=--relay_from=1 run_tool relay true
check relay 'd["ok"] and d["cached_pins"] == 8 and d["pins_without_assignment"] == 8'
check relay 'd["pins_relayed_first"] == 0 and d["pins_relayed_cached"] == 7'

run_tool whole false
check whole 'd["ok"] and d["cached_pins"] == 8 and d["pins_without_assignment"] == 0'
TESSERA_BENCH_PLAN_COORD_FLAGS=--hand_out_threads=4 run_tool threads true 2 8 64 4
check threads 'd["ok"] and d["ranks"] == 1024 and d["cached_pins"] == 1024'
check threads 'd["pins_without_assignment"] == 1024'
check threads 'd["pins_relayed_first"] == 0 and d["pins_relayed_cached"] == 896'
[ "$(grep -c "1024 commands handed to the streams in .* on 4 threads$" \
    "$work/raw/plan-events-threads.txt")" -ge 2 ] ||
  fail "threads: the fan-outs of 1,024 commands were not logged as handed out on 4 threads: \
$(cat "$work/raw/plan-events-threads.txt")"
grep -q "1024 commands handed to the streams in .* (128 written, 896 of them relayed by agents)" \
  "$work/raw/plan-events-threads.txt" ||
  fail "threads: save 2's PINs were not logged as relayed: $(cat "$work/raw/plan-events-threads.txt")"
echo "PASS: the planning load tool against a real coordinator, with fingerprints and whole" \
  "plans, with relayed PINs, and at 1,024 ranks with fan-outs on 4 threads"
