#!/usr/bin/env bash
# The wheel as a user installs it: a fresh venv of /usr/bin/python3 (no torch, no numpy, no
# PYTHONPATH), `pip install` of //client/python:wheel from the file alone (--no-index), then
# wheel_install_test.py under that venv's Python against a real coordinator and agent.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=3000
trap stop_all EXIT
mkdir -p "$DIR/logs"
wheel=$(ls "$PWD"/client/python/tessera-*.whl)
venv="$DIR/venv"
/usr/bin/python3 -m venv "$venv" || fail "python3 -m venv"
"$venv/bin/python" -m pip install --no-index --no-deps --disable-pip-version-check "$wheel" \
  >"$DIR/logs/pip.log" 2>&1 || fail "pip install $(basename "$wheel"): $(cat "$DIR/logs/pip.log")"
echo "installed $(basename "$wheel") into a fresh venv"

start_coordinator || fail "coordinator"
start_agents pywheel dp=1 || fail "agent"
# The harness (testlib.py) comes from a directory of its own: the source tree's
# client/python would put the unbuilt tessera/ sources on the path.
mkdir -p "$DIR/harness"
cp client/python/testlib.py "$DIR/harness/"
unset PYTHONPATH
TESSERA_WHEEL="$wheel" TESSERA_VENV_UNDER_TEST="$venv" TESSERA_AGENT="$SOCK_DIR/pywheel-0.sock" \
  PYTHONPATH="$DIR/harness" "$venv/bin/python" -P client/python/wheel_install_test.py
rc=$?
stop_agents || fail "agent did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
exit "$rc"
