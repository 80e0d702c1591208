#!/usr/bin/env bash
# examples/pytorch/train_fsdp2.py as README.md runs it: a coordinator and two agents
# (--layout=dp_shard=2) on loopback, torchrun with two processes on the CPU. The first run
# trains steps 1-4 and saves every 2; the second run resumes from `latest` (step 4) and
# trains to step 6; every committed checkpoint verifies. (Tests import the package from
# Bazel's build; users pip-install the wheel, which wheel_install_test covers.)
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
LEASE_MS=3000
trap stop_all EXIT
fail() {
  echo "FAIL: $*"
  tail -n 30 "$DIR"/logs/run-*.out 2>/dev/null
  tail -n 10 "$DIR"/logs/*.log 2>/dev/null
  exit 1
}
mkdir -p "$DIR/logs"
export PYTHONPATH="$PWD/client/python/site" PYTHONDONTWRITEBYTECODE=1 GLOO_SOCKET_IFNAME=lo
start_coordinator || fail "coordinator"
start_agents example dp_shard=2 || fail "agents"

# torchrun FLAGS...: the example on two processes; output in $DIR/logs/run-<n>.out.
runs=0
torchrun() {
  runs=$((runs + 1))
  timeout 240 "$TESSERA_PYTHON" -m torch.distributed.run --standalone --nproc_per_node=2 \
    examples/pytorch/train_fsdp2.py --agent="$SOCK_DIR/example-{rank}.sock" "$@" \
    >"$DIR/logs/run-$runs.out" 2>&1 || fail "torchrun $* exited $?"
  sed 's/^/   /' "$DIR/logs/run-$runs.out" | grep -E "^   (step|resumed)"
}
expect() { grep -Eq -- "$2" "$DIR/logs/run-$1.out" || fail "run $1 printed no line matching /$2/"; }

torchrun --steps=4 --save-every=2
expect 1 "^step 2 saved: training blocked"
expect 1 "^step 4 committed: .*/example/step-000000004$"
grep -q "^resumed" "$DIR/logs/run-1.out" && fail "the first run resumed"
torchrun --steps=6 --save-every=2
expect 2 "^resumed from step 4$"
grep -q "^step [1-4] loss" "$DIR/logs/run-2.out" && fail "the resumed run trained a step it had"
expect 2 "^step 5 loss "
expect 2 "^step 6 committed: "
for step in 2 4 6; do
  out=$("$BIN/client/cli/tessera" verify "$DIR/ckpt/example/step-$(printf %09d "$step")") ||
    fail "verify step $step: $out"
  echo "verify step $step: $out"
done
stop_agents || fail "agents did not stop cleanly"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: the FSDP2 example saved every 2 steps and resumed from latest"
