#!/usr/bin/env bash
# python -m tessera.run (issue 49): agents for this node's ranks around a torchrun command.
#   1. a layout of 4 ranks around torchrun's 1 node x 2 processes: refused, exit 2, naming both
#      numbers, before any agent starts;
#   2. an unreachable coordinator: exit 3 within --register-timeout, naming the rank whose
#      agent did not register;
#   3. the FSDP2 example under torchrun, its agents started, registered and stopped by the
#      launcher: step 2 committed and verified, the launcher exits 0, every agent stopped.
set -uo pipefail
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
BIN=.
DIR=${TEST_TMPDIR:-$(mktemp -d)}/run
trap stop_all EXIT
source tests/seeds/seeds_lib.sh
export GLOO_SOCKET_IFNAME=lo
mkdir -p "$DIR/logs"
start_coordinator || fail "coordinator"
# launcher NAME ARGS...: python -m tessera.run, its agents' sockets and logs in $SOCK_DIR/NAME
# (short: a unix socket path holds 107 bytes); output in $DIR/logs/NAME.out.
launcher() {
  local name=$1; shift
  mkdir -p "$SOCK_DIR/$name"
  timeout 240 "$PYTHON" -m tessera.run --agent-bin="$BIN/agent/tessera-agent" \
    --socket-dir="$SOCK_DIR/$name" "$@" >"$DIR/logs/$name.out" 2>&1
}
TORCHRUN=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=2)

launcher wrong --coordinator="$(coordinator_address)" --job=lt --layout=dp_shard=4 -- \
  "${TORCHRUN[@]}" examples/pytorch/train_fsdp2.py
rc=$?
[ "$rc" = 2 ] || fail "a layout of 4 ranks around 2 processes exited $rc: $(cat "$DIR/logs/wrong.out")"
grep -q "layout dp_shard=4 has 4 ranks, but torchrun runs 1 node x 2 processes" "$DIR/logs/wrong.out" ||
  fail "the refusal is unclear: $(cat "$DIR/logs/wrong.out")"
[ -z "$(ls -A "$SOCK_DIR/wrong")" ] || fail "agents were started for a refused layout: $(ls "$SOCK_DIR/wrong")"
echo "   1. $(cat "$DIR/logs/wrong.out")"

launcher unreachable --coordinator=127.0.0.1:1 --job=lt --layout=dp_shard=1 \
  --nproc-per-node=1 --register-timeout=3 -- true
rc=$?
[ "$rc" = 3 ] || fail "an unreachable coordinator: exit $rc: $(cat "$DIR/logs/unreachable.out")"
grep -q "the agent of rank 0 (job lt, coordinator 127.0.0.1:1) not registered after 3 s" \
  "$DIR/logs/unreachable.out" || fail "the failure is unclear: $(cat "$DIR/logs/unreachable.out")"
grep -q "cannot register with the coordinator (UNAVAILABLE" "$DIR/logs/unreachable.out" ||
  fail "the agent's log tail does not say why: $(cat "$DIR/logs/unreachable.out")"
echo "   2. $(head -n 1 "$DIR/logs/unreachable.out")"

launcher ok --coordinator="$(coordinator_address)" --job=lt --layout=dp_shard=2 -- \
  "${TORCHRUN[@]}" examples/pytorch/train_fsdp2.py --steps=2 --save-every=2 ||
  fail "the launcher exited $?: $(tail -n 20 "$DIR/logs/ok.out")"
grep -q "^tessera.run: 2 agents registered (job lt, ranks 0-1 of 2)" "$DIR/logs/ok.out" ||
  fail "no registration line: $(head -n 5 "$DIR/logs/ok.out")"
grep -q "^step 2 committed: .*/lt/step-000000002$" "$DIR/logs/ok.out" ||
  fail "step 2 was not committed: $(tail -n 10 "$DIR/logs/ok.out")"
"$BIN/client/cli/tessera" verify "$DIR/ckpt/lt/step-000000002" >"$DIR/logs/verify.out" ||
  fail "verify: $(cat "$DIR/logs/verify.out")"
for r in 0 1; do
  grep -q "stopped$" "$SOCK_DIR/ok/agent-$r.log" ||
    fail "agent $r was not stopped: $(tail -n 3 "$SOCK_DIR/ok/agent-$r.log")"
done
echo "   3. torchrun under the launcher: step 2 committed and verified; both agents stopped after"
stop_coordinator || fail "coordinator did not stop cleanly"
echo "PASS: python -m tessera.run refused a wrong world size and an unreachable coordinator clearly, and ran the FSDP2 example with its agents"
