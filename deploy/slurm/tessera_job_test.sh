#!/usr/bin/env bash
# Runs deploy/slurm/tessera_job.sbatch for real, on one machine: stand-ins for `srun` (runs
# --ntasks copies of the command with SLURM_PROCID/SLURM_LOCALID set) and `scontrol show
# hostnames` on PATH, real tessera-coordinator and tessera-agent binaries, and the example
# llama trainer as the trainer command. Asserts:
#   1. without TESSERA_COORDINATOR the script starts a coordinator; every task gets its own
#      agent (rank = SLURM_PROCID) and socket in TESSERA_AGENT, RANK/WORLD_SIZE/LOCAL_RANK;
#      4 ranks as TP2 x DP2 save step 100, which commits under TESSERA_STORAGE_ROOT;
#   2. the agents and the coordinator the scripts started stop cleanly (exit 0) afterwards;
#   3. with TESSERA_COORDINATOR set, no coordinator is started and the agents use that one;
#      a second save (step 200) commits;
#   4. a layout whose world size differs from the task count is refused (exit 2).
set -uo pipefail
source deploy/lib/procs.sh

root=$(pwd)
dir=${TEST_TMPDIR:-$(mktemp -d)}
short=$(mktemp -d /tmp/tessera-slurm.XXXXXX)  # TMPDIR of the tasks: short socket paths
ext_pid=""
cleanup() {
  [ -z "$ext_pid" ] || stop_process "$ext_pid" 10 >/dev/null
  rm -rf "$short"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/submit/tessera-logs/*/* "$dir"/run*.out "$dir"/external.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }
  done
  exit 1
}

# Stand-ins for the Slurm commands the script uses.
mkdir -p "$dir/fakebin" "$dir/bin" "$dir/submit"
cat >"$dir/fakebin/srun" <<'SRUN'
#!/usr/bin/env bash
ntasks=1
while [ $# -gt 0 ]; do
  case "$1" in
    --ntasks=*) ntasks=${1#*=} ;;
    --ntasks-per-node=* | --kill-on-bad-exit=*) ;;
    -*) echo "fake srun: unexpected option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
pids=()
for ((i = 0; i < ntasks; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i SLURMD_NODENAME=node0 "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
SRUN
printf '#!/bin/sh\necho localhost\n' >"$dir/fakebin/scontrol"
chmod +x "$dir/fakebin/srun" "$dir/fakebin/scontrol"
ln -sf "$root/server/tessera-coordinator" "$dir/bin/tessera-coordinator"
ln -sf "$root/agent/tessera-agent" "$dir/bin/tessera-agent"

# The trainer command: records its environment, then saves one step through its agent.
cat >"$dir/train.sh" <<'TRAIN'
#!/usr/bin/env bash
env | grep -E '^(TESSERA_AGENT|RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT)=' \
  >"$TRAIN_ENV_DIR/env-$RANK"
exec "$TRAINER" --agent_socket="$TESSERA_AGENT" --mode=save --steps="$STEP" --total_mb=4
TRAIN
chmod +x "$dir/train.sh"

run_job() {  # run_job OUTPUT [VAR=VALUE...]: the sbatch script as Slurm would run it
  local out=$1; shift
  (cd "$dir/submit" && env PATH="$dir/fakebin:$PATH" SLURM_JOB_ID="$RANDOM" SLURM_JOB_NAME=llama \
    SLURM_NTASKS=4 SLURM_NTASKS_PER_NODE=4 SLURM_SUBMIT_DIR="$dir/submit" \
    SLURM_JOB_NODELIST=node0 TMPDIR="$short" TESSERA_BIN="$dir/bin" \
    TESSERA_TASK_SCRIPT="$root/deploy/slurm/tessera_task.sh" TESSERA_LAYOUT=tp=2,dp=2 \
    TESSERA_AGENT_FLAGS="--peer_listen=127.0.0.1:0 --peer_host=127.0.0.1" \
    TRAINER="$root/examples/tessera-llama-trainer" TRAIN_ENV_DIR="$dir/env" "$@" \
    timeout 300 bash "$root/deploy/slurm/tessera_job.sbatch" "$dir/train.sh") >"$out" 2>&1
}

# 1-2: the script starts the coordinator.
mkdir -p "$dir/env"
run_job "$dir/run1.out" STEP=100 TESSERA_STORAGE_ROOT="$dir/ckpt" \
  TESSERA_STATE_DIR="$dir/state" TESSERA_COORDINATOR_HOST=127.0.0.1 ||
  fail "the job with its own coordinator failed"
grep -q "started a coordinator at 127.0.0.1:" "$dir/run1.out" || fail "no coordinator started"
[ -f "$dir/ckpt/llama/step-000000100/manifest.pb" ] || fail "step 100 was not committed"
[ -d "$dir/state/db" ] || fail "the coordinator's RocksDB is not in TESSERA_STATE_DIR"
for r in 0 1 2 3; do
  env_file="$dir/env/env-$r"
  [ -f "$env_file" ] || fail "rank $r: the trainer did not run"
  grep -qx "RANK=$r" "$env_file" || fail "rank $r: RANK"
  grep -qx "LOCAL_RANK=$r" "$env_file" || fail "rank $r: LOCAL_RANK"
  grep -qx "WORLD_SIZE=4" "$env_file" || fail "rank $r: WORLD_SIZE"
  grep -qx "MASTER_ADDR=localhost" "$env_file" || fail "rank $r: MASTER_ADDR"
  grep -Eqx "TESSERA_AGENT=$short/tessera-[0-9]+/agent-$r.sock" "$env_file" ||
    fail "rank $r: TESSERA_AGENT is not its own socket: $(cat "$env_file")"
done
logs=$(echo "$dir"/submit/tessera-logs/*)
for r in 0 1 2 3; do
  grep -q "agent\[$r\]: starting for job llama" "$logs/agent-$r.log" ||
    fail "rank $r: the agent did not log its start as rank $r"
  grep -q "stopped" "$logs/agent-$r.log" || fail "rank $r: the agent did not stop cleanly"
done
grep -q "stopped" "$logs/coordinator.log" || fail "the coordinator did not stop cleanly"
[ -z "$(ls -A "$short")" ] || fail "sockets left behind: $(ls -R "$short")"

# 3: an external coordinator.
"$root/server/tessera-coordinator" --listen=127.0.0.1:0 --db_path="$dir/state2" \
  --storage_root="$dir/ckpt2" 2>"$dir/external.log" &
ext_pid=$!
wait_for_line "$dir/external.log" "listening on" 20 || fail "the external coordinator did not start"
port=$(bound_port "$dir/external.log")
rm -rf "$dir/submit/tessera-logs"
run_job "$dir/run2.out" STEP=200 TESSERA_COORDINATOR="127.0.0.1:$port" ||
  fail "the job with an external coordinator failed"
grep -q "started a coordinator" "$dir/run2.out" && fail "a coordinator was started"
[ -f "$dir/ckpt2/llama/step-000000200/manifest.pb" ] || fail "step 200 was not committed"
[ "$(count_lines "$dir/external.log" "registered agent job=llama")" -ge 4 ] ||
  fail "the agents did not register with the external coordinator"

# 4: layout and task count disagree.
run_job "$dir/run3.out" STEP=300 TESSERA_COORDINATOR="127.0.0.1:$port" TESSERA_LAYOUT=tp=2,dp=4
rc=$?
[ "$rc" -eq 2 ] || fail "a layout of 8 ranks for 4 tasks: exit $rc, want 2"
grep -q "has 8 ranks but the job has 4 tasks" "$dir/run3.out" || fail "no explanation printed"

stop_process "$ext_pid" 10 || fail "the external coordinator did not stop cleanly"
ext_pid=""
echo "PASS: sbatch script starts a coordinator and one agent per task; saves commit; agents" \
  "and coordinator stop cleanly; an external coordinator is used; a layout mismatch exits 2"
