#!/usr/bin/env bash
# End-to-end (real processes on loopback): a llama-like model with AdamW state saved by 8
# ranks as $SAVE_LAYOUT (default PP2xTP2xDP2), committed, then loaded by new agents and
# trainers on each of $LOAD_LAYOUTS and checked byte for byte. With OPTIMIZER=distributed the
# optimizer state is flat-range slices across DP, gathered to DP leaders before writing.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
OPTIMIZER=${OPTIMIZER:-replicated}
SAVE_LAYOUT=${SAVE_LAYOUT:-pp=2,tp=2,dp=2}
LOAD_LAYOUTS=${LOAD_LAYOUTS:-pp=1,tp=2,dp=4 pp=2,tp=1,dp=4}
LEASE_MS=1500
trap stop_all EXIT
metrics_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# --relay_from=1: the cached save's PINs (step 20) go to one agent of the node, which passes
# them on to the other seven (DESIGN.md "Relayed PINs"); at this size they would not be.
start_coordinator --metrics_listen="127.0.0.1:$metrics_port" --keep_last=1 --relay_from=1 ||
  fail "coordinator"
start_agents llama "$SAVE_LAYOUT" || fail "agents (save layout)"
run_trainers llama "$SAVE_LAYOUT" --mode=save --steps=10,20 --optimizer="$OPTIMIZER" ||
  fail "saving on $SAVE_LAYOUT"
grep -q "step 20 committed" "$DIR/logs/trainer-llama-0.out" || fail "no commit of step 20"
grep -q "(plan cached)" "$DIR/logs/trainer-llama-0.out" || fail "the second save did not reuse the plan"
world=$(world_size "$SAVE_LAYOUT")
grep -q " commands handed to the streams in .* (1 written, $((world - 1)) of them relayed by agents)" \
  "$DIR/logs/coordinator.log" || fail "step 20's PINs were not relayed by one agent"
grep -q "relayed session .* to $((world - 1)) agent(s) in" "$DIR/logs/agent-llama-0.log" ||
  fail "rank 0's agent did not pass the PIN on to the other $((world - 1)) agents"
grep -h "relayed session" "$DIR/logs/agent-llama-0.log"  # how long passing it on took
[ -f "$DIR/ckpt/llama/step-000000020/manifest.pb" ] || fail "no committed directory for step 20"
# Retention (--keep_last=1): step 10 is deleted once step 20 is committed. Deletion renames
# the directory to .tmp-gc-* first and then removes it: wait for both to be gone.
waited=0
while [ -e "$DIR/ckpt/llama/step-000000010" ] || ls "$DIR/ckpt/llama" | grep -q '\.tmp-'; do
  sleep 0.1; waited=$((waited + 1))
  if [ $waited -ge 100 ]; then
    [ -e "$DIR/ckpt/llama/step-000000010" ] && fail "retention kept step 10"
    fail "a temporary directory was left behind"
  fi
done
# The Prometheus endpoint counts what happened.
/usr/bin/python3 - "$metrics_port" <<'PY' || fail "metrics endpoint"
import re, sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
def value(pattern):
    m = re.search(r"^" + pattern + r" ([0-9.e+]+)$", text, re.M)
    assert m, "no " + pattern + " in /metrics"
    return float(m.group(1))
assert value("tessera_sessions_committed_total") == 2, text
assert value("tessera_bytes_committed_total") > 0
assert value(r'tessera_agents_alive\{job="llama"\}') == 8
assert value("tessera_trainer_stall_seconds_count") == 16
assert value(r'tessera_phase_seconds_count\{phase="PERSISTING"\}') == 2
PY
stop_agents || fail "agents did not stop cleanly"

for layout in $LOAD_LAYOUTS; do
  start_agents llama "$layout" || fail "agents ($layout)"
  run_trainers llama "$layout" --mode=load --load_step=-1 --optimizer="$OPTIMIZER" ||
    fail "loading on $layout"
  grep -q "loaded step 20 on $layout" "$DIR/logs/trainer-llama-0.out" || fail "wrong step on $layout"
  stop_agents || fail "agents ($layout) did not stop cleanly"
done
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: saved on $SAVE_LAYOUT ($OPTIMIZER optimizer), loaded byte-identical on $LOAD_LAYOUTS"
