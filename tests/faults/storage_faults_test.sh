#!/usr/bin/env bash
# Fault matrix (issue 6), storage errors end to end (real processes on loopback, tp=2,dp=2):
# - enospc_mid_write: rank 1's agent runs with --inject_storage_fault=enospc:after_bytes=N
#   (test-only flag; FaultInjectingStorage over the real files): its data file is cut short by
#   "No space left on device";
# - eio_mid_write: the same with EIO ("Input/output error");
# - read_only_root: rank 1's agent sees the storage root read-only. Where the test may create
#   a mount namespace (root or CAP_SYS_ADMIN), that is a real read-only bind mount of the
#   root (`unshare -m`, `mount -o remount,bind,ro`) and the kernel returns EROFS; otherwise the
#   test says so and uses --inject_storage_fault=readonly instead (EROFS from the fault layer).
# Each: the session ABORTED with IO_ERROR naming the file and the errno (in `tessera status`),
# no directory of the step committed or listed, the temporary directory removed, the previous
# latest verifies and loads byte for byte; then a healthy agent saves again. Every process ends
# within a bound.
source tests/faults/lib.sh

start_coordinator || fail "coordinator"
start_agents "$JOB" "$LAYOUT" || fail "agents"
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=10 "${MODEL[@]}" || fail "first save"
[ "$(latest_step)" = "step-000000010" ] || fail "step 10 not committed"

# storage_fault_case NAME STEP CODE_REGEX: rank 1's agent is already running with the fault;
# the save of STEP must abort with IO_ERROR whose path is rank 1's data file of STEP and whose
# text matches CODE_REGEX; then rank 1 is restarted healthy.
storage_fault_case() {
  local name=$1 step=$2 regex=$3 aborts
  aborts=$(count_lines "$DIR/logs/coordinator.log" "ABORTED")
  if run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps="$step" "${MODEL[@]}"; then
    fail "$name: the save of step $step succeeded despite the storage fault"
  fi
  wait_aborts_beyond "$aborts" 20
  expect_aborted_status "$name" IO_ERROR "$regex"
  local path
  path=$(status_field "$DIR/logs/status-$name.json" 's["error"]["path"]')
  case "$path" in
    "$DIR/ckpt/$JOB/step-$(printf %09d "$step").tmp-"*) ;;
    *) fail "$name: the error's path is not in step $step's temporary directory: $path" ;;
  esac
  # Every trainer hears the cause (not a consequence such as its own writer finding the
  # temporary directory removed under it).
  for r in 0 1 2 3; do
    grep -Eq "$regex" "$DIR/logs/trainer-$JOB-$r.out" ||
      fail "$name: trainer $r was not told the cause: $(cat "$DIR/logs/trainer-$JOB-$r.out")"
  done
  expect_not_committed "$step"
  expect_latest_intact 10
  restart_agent 1
}

# --- enospc_mid_write ------------------------------------------------------------------------
restart_agent 1 --inject_storage_fault=enospc:after_bytes=300000
storage_fault_case enospc_mid_write 11 "No space left on device \(errno 28\)"
echo "ok: enospc_mid_write -> IO_ERROR naming the file and ENOSPC; step 10 intact"

# --- eio_mid_write ---------------------------------------------------------------------------
restart_agent 1 --inject_storage_fault=eio:after_bytes=300000
storage_fault_case eio_mid_write 12 "Input/output error \(errno 5\)"
echo "ok: eio_mid_write -> IO_ERROR naming the file and EIO; step 10 intact"

# --- read_only_root --------------------------------------------------------------------------
probe="$DIR/ro-probe"
mkdir -p "$probe"
if unshare -m -- /bin/sh -c 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" &&
    ! touch "$1/x" 2>/dev/null' sh "$probe" 2>/dev/null; then
  echo "   read_only_root: a real read-only bind mount of the storage root (unshare -m)"
  kill -TERM "${AGENT_PIDS[1]}"
  wait_pid_bounded "${AGENT_PIDS[1]}" 10 "agent 1"
  mark_agent_log "$JOB" 1
  # As start_agent, inside a mount namespace where the storage root is read-only. unshare and
  # sh exec into the agent, so AGENT_PIDS[1] is the agent.
  unshare -m -- /bin/sh -c 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" &&
      shift && exec "$@"' sh "$DIR/ckpt" \
    "$BIN/agent/tessera-agent" --coordinator="127.0.0.1:$COORD_PORT" --job="$JOB" --rank=1 \
    --layout="$LAYOUT" --socket="$SOCK_DIR/$JOB-1.sock" --peer_listen=127.0.0.1:0 \
    --peer_host=127.0.0.1 2>>"$DIR/logs/agent-$JOB-1.log" &
  AGENT_PIDS[1]=$!
  wait_registered "$JOB" 1 || fail "the agent with a read-only root did not register"
else
  echo "   read_only_root: NOTE: this machine does not allow a mount namespace here, so the"
  echo "   read-only root is SIMULATED with --inject_storage_fault=readonly (EROFS from the"
  echo "   fault layer, not from the kernel)"
  restart_agent 1 --inject_storage_fault=readonly
fi
storage_fault_case read_only_root 13 "Read-only file system \(errno 30\)"
echo "ok: read_only_root -> IO_ERROR naming the path and EROFS; step 10 intact"

# A healthy save after the faults commits and verifies.
run_trainers_bounded "$JOB" "$LAYOUT" --mode=save --steps=14 "${MODEL[@]}" ||
  fail "a save after the storage faults failed"
"$CLI" verify "$(step_dir 14)" >"$DIR/logs/verify-14.out" 2>&1 || fail "step 14 does not verify"
expect_committed_status later_save 14
finish
echo "PASS: ENOSPC and EIO mid-write and a read-only root abort with IO_ERROR naming path and errno; nothing committed; the latest stays intact"
