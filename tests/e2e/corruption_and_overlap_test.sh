#!/usr/bin/env bash
# End-to-end (real processes on loopback, tp=2,dp=2):
# - a byte flipped inside a chunk of a committed data file: `tessera verify` exits 1 naming the
#   tensor, chunk and file; trainers restarted beside the agents that saved it still load it
#   from their memory tier, byte for byte; once the agents restart, a trainer loading that
#   step fails with CHECKSUM_MISMATCH;
# - a save of a step that is already committed is refused with STEP_EXISTS.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=1500
LAYOUT=tp=2,dp=2
TRAINER_TIMEOUT=120
trap stop_all EXIT
start_coordinator || fail "coordinator"
start_agents job "$LAYOUT" || fail "agents"
run_trainers job "$LAYOUT" --mode=save --steps=10,20 --layers=2 --dim=128 || fail "saving 10, 20"
dir10="$DIR/ckpt/job/step-000000010"
dir20="$DIR/ckpt/job/step-000000020"
[ -f "$dir10/manifest.pb" ] && [ -f "$dir20/manifest.pb" ] || fail "steps 10 and 20 not committed"

# --- step_exists_refused -------------------------------------------------------------------
run_trainers job "$LAYOUT" --mode=save --steps=10 --layers=2 --dim=128 \
  --expect_error=STEP_EXISTS || fail "a save of the committed step 10 was not refused with STEP_EXISTS"
for r in 0 1 2 3; do
  grep -q "failed as expected: STEP_EXISTS" "$DIR/logs/trainer-job-$r.out" ||
    fail "rank $r did not report STEP_EXISTS"
done
"$BIN/client/cli/tessera" verify "$dir10" >"$DIR/logs/verify-10-after-refusal.out" 2>&1 ||
  fail "step 10 no longer verifies after the refused save"
run_trainers job "$LAYOUT" --mode=load --load_step=10 --layers=2 --dim=128 ||
  fail "step 10 does not load after the refused save"
echo "ok: step_exists_refused"

# --- corrupted_chunk_detected --------------------------------------------------------------
"$BIN/client/cli/tessera" verify "$dir20" >"$DIR/logs/verify-20-before.out" 2>&1 ||
  fail "step 20 does not verify before corruption: $(cat "$DIR/logs/verify-20-before.out")"
victim=$(ls -S "$dir20" | grep -v '^manifest' | head -n 1)
[ -n "$victim" ] && [ -f "$dir20/$victim" ] || fail "no data file in $dir20"
/usr/bin/python3 - "$dir20/$victim" <<'PY' || fail "flipping a byte"
import os, sys
path = sys.argv[1]
offset = os.path.getsize(path) // 2
with open(path, "r+b") as f:
    f.seek(offset)
    b = f.read(1)
    f.seek(offset)
    f.write(bytes([b[0] ^ 0xFF]))
PY
"$BIN/client/cli/tessera" verify "$dir20" >"$DIR/logs/verify-20-after.out" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "verify of the corrupted checkpoint exited $rc, not 1: $(cat "$DIR/logs/verify-20-after.out")"
grep -q "$victim" "$DIR/logs/verify-20-after.out" ||
  fail "verify does not name the file $victim: $(cat "$DIR/logs/verify-20-after.out")"
"$BIN/client/cli/tessera" verify --json "$dir20" >"$DIR/logs/verify-20-after.json" 2>&1
/usr/bin/python3 - "$DIR/logs/verify-20-after.json" "$victim" <<'PY' ||
import json, sys
report = json.load(open(sys.argv[1]))
assert report["ok"] is False, report
mismatches = [p for p in report["problems"] if p["code"] == "CHECKSUM_MISMATCH"]
assert mismatches, report
for p in mismatches:
    assert p["tensor"] and p["chunk"] and p["file"].endswith(sys.argv[2]), p
PY
  fail "verify --json does not report a CHECKSUM_MISMATCH naming tensor, chunk and $victim: $(cat "$DIR/logs/verify-20-after.json")"
# The agents still hold step 20 in memory (DESIGN.md "Memory tier"), verified against the
# manifest: a restart on this node loads it byte for byte and reads nothing from the damaged
# file.
run_trainers job "$LAYOUT" --mode=load --load_step=20 --layers=2 --dim=128 ||
  fail "step 20 does not load from the agents' memory"
for r in 0 1 2 3; do
  grep -q "load sources: .* disk_bytes=0 " "$DIR/logs/trainer-job-$r.out" ||
    fail "rank $r read step 20 from disk: $(grep 'load sources' "$DIR/logs/trainer-job-$r.out")"
done
# New agents hold nothing: the load reads the file and finds the flipped byte.
stop_agents || fail "agents did not stop cleanly"
start_agents job "$LAYOUT" || fail "agents (restarted)"
if run_trainers job "$LAYOUT" --mode=load --load_step=20 --layers=2 --dim=128; then
  fail "loading the corrupted step 20 from disk succeeded"
fi
# The trainer prints the status (DATA_LOSS, with the CHECKSUM_MISMATCH ErrorDetail as a binary
# payload): accept the code name or the checksum-mismatch message naming the corrupted file.
cat "$DIR"/logs/trainer-job-*.out | grep -E "CHECKSUM_MISMATCH|checksum mismatch in tensor" |
  grep -q "$victim" || fail "the failed load does not report a checksum mismatch in $victim"
# The intact step still loads.
run_trainers job "$LAYOUT" --mode=load --load_step=10 --layers=2 --dim=128 ||
  fail "step 10 does not load after step 20 was corrupted"
echo "ok: corrupted_chunk_detected"

stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: a flipped byte fails verify (exit 1, naming tensor/chunk/file) and load (CHECKSUM_MISMATCH); a save of an existing step is refused with STEP_EXISTS"
