# A Tessera cluster on loopback for the quickstart and the end-to-end tests (source it after
# procs.sh). Set BIN (directory holding server/, agent/, examples/ binaries) and DIR (work
# directory) first. Every wait is bounded. Trainer sockets live in SOCK_DIR (default: a short
# directory under /tmp, since a unix socket path is limited to 107 bytes).

SOCK_DIR=${SOCK_DIR:-$(mktemp -d /tmp/tessera-sock.XXXXXX)}
# Several hosts (tests/hosts/): by default everything runs here, on 127.0.0.1. A caller may
# set COORD_HOST (the address the coordinator listens on and agents dial), COORD_WRAP (an
# array: the command prefix the coordinator runs under, e.g. (ip netns exec ns0)), and, after
# sourcing this file, redefine place_rank RANK to set PLACE_WRAP (array: the prefix that
# rank's agent and trainer run under), PLACE_ADDR (the address its agent's peer service binds
# and advertises) and PLACE_NODE (its --node_id; empty: the agent's default, the hostname).
COORD_HOST=${COORD_HOST:-127.0.0.1}
declare -p COORD_WRAP >/dev/null 2>&1 || COORD_WRAP=()
PLACE_WRAP=()
PLACE_ADDR=127.0.0.1
PLACE_NODE=""
place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=""; }
# coordinator_address: host:port agents and the CLI dial (after start_coordinator).
coordinator_address() { echo "$COORD_HOST:$COORD_PORT"; }
COORD_PID=""
COORD_PORT=""
AGENT_PIDS=()
TRAINER_PIDS=()

# start_coordinator [extra flags...]: RocksDB in $DIR/db, checkpoints in $STORAGE_ROOT (default
# $DIR/ckpt; s3://BUCKET/PREFIX after start_local_s3).
start_coordinator() {
  mkdir -p "$DIR/logs"
  local log="$DIR/logs/coordinator.log" before waited=0
  before=$(count_lines "$log" "listening on")  # a restart appends to the same log
  "${COORD_WRAP[@]}" "$BIN/server/tessera-coordinator" --listen="$COORD_HOST:${COORD_PORT:-0}" \
    --db_path="$DIR/db" \
    --storage_root="${STORAGE_ROOT:-$DIR/ckpt}" --lease_ms="${LEASE_MS:-3000}" --heartbeat_interval_ms=300 \
    "$@" 2>>"$log" &
  COORD_PID=$!
  until [ "$(count_lines "$log" "listening on")" -gt "$before" ]; do
    kill -0 "$COORD_PID" 2>/dev/null || { echo "the coordinator exited; see $log" >&2; return 1; }
    sleep 0.1
    waited=$((waited + 1))
    [ $waited -lt 300 ] || { echo "the coordinator did not start; see $log" >&2; return 1; }
  done
  COORD_PORT=$(bound_port "$log")
}

# world_size LAYOUT: product of the degrees in "pp=2,tp=2,dp=2".
world_size() {
  local n=1 part
  IFS=',' read -ra parts <<<"$1"
  for part in "${parts[@]}"; do n=$((n * ${part#*=})); done
  echo "$n"
}

# start_agent JOB LAYOUT RANK [extra flags...]: (re)starts one agent; its pid replaces
# AGENT_PIDS[RANK]. Socket $SOCK_DIR/<job>-<rank>.sock, log $DIR/logs/agent-<job>-<rank>.log.
# Every rank of the layout runs on this machine, so its agents share its memory
# (--agents_per_node: the world size; an extra flag may say otherwise). --storage_root: the
# coordinator's (STORAGE_ROOT), so every agent checks the root it is handed (issue 51).
start_agent() {
  local job=$1 layout=$2 r=$3; shift 3
  mkdir -p "$SOCK_DIR" "$DIR/logs"
  place_rank "$r"
  "${PLACE_WRAP[@]}" "$BIN/agent/tessera-agent" --coordinator="$(coordinator_address)" \
    --job="$job" --rank="$r" --layout="$layout" --socket="$SOCK_DIR/$job-$r.sock" \
    --peer_listen="$PLACE_ADDR:0" --peer_host="$PLACE_ADDR" \
    --agents_per_node="$(world_size "$layout")" --storage_root="${STORAGE_ROOT:-$DIR/ckpt}" \
    ${PLACE_NODE:+"--node_id=$PLACE_NODE"} "$@" 2>>"$DIR/logs/agent-$job-$r.log" &
  AGENT_PIDS[$r]=$!
}

# mark_agent_log JOB RANK, then wait_registered JOB RANK: waits (bounded) until that agent's
# log shows one more lease renewal than when it was marked — it registered again.
declare -A AGENT_MARKS
mark_agent_log() { AGENT_MARKS["$1-$2"]=$(count_lines "$DIR/logs/agent-$1-$2.log" "lease renewed"); }
wait_registered() {
  local waited=0
  until [ "$(count_lines "$DIR/logs/agent-$1-$2.log" "lease renewed")" -gt "${AGENT_MARKS["$1-$2"]:-0}" ]; do
    sleep 0.1
    waited=$((waited + 1))
    [ $waited -lt 300 ] || { echo "agent $2 of $1 did not register" >&2; return 1; }
  done
}

# start_agents JOB LAYOUT [extra flags...]: one agent per rank, and waits for all to register.
# A job's new layout needs no wait of its own: the coordinator takes a new mesh only once the
# old agents' leases expired, and the new agents retry their registration until then.
start_agents() {
  local job=$1 layout=$2; shift 2
  local n r
  n=$(world_size "$layout")
  AGENT_PIDS=()
  for r in $(seq 0 $((n - 1))); do
    mkdir -p "$DIR/logs"
    : >"$DIR/logs/agent-$job-$r.log"
    start_agent "$job" "$layout" "$r" "$@"
  done
  for r in $(seq 0 $((n - 1))); do
    wait_for_line "$DIR/logs/agent-$job-$r.log" "lease renewed" 30 || return 1
  done
}

# start_jobs JOB:LAYOUT...: start_agents for each job in turn; AGENT_PIDS ends up holding every
# job's agents (so that stop_agents stops them all). Returns non-zero, naming the job on
# stderr, at the first whose agents did not start.
start_jobs() {
  local job_layout rc all=()
  for job_layout in "$@"; do
    start_agents "${job_layout%%:*}" "${job_layout#*:}"
    rc=$?
    all+=("${AGENT_PIDS[@]}")
    AGENT_PIDS=("${all[@]}")
    [ "$rc" -eq 0 ] || { echo "agents of $job_layout did not start" >&2; return 1; }
  done
}

# run_trainers JOB LAYOUT [trainer flags...]: one trainer per rank, in parallel; returns
# non-zero if any failed. Output in $DIR/logs/trainer-<job>-<r>.out.
run_trainers() {
  local job=$1 layout=$2; shift 2
  local n r rc=0
  n=$(world_size "$layout")
  TRAINER_PIDS=()
  for r in $(seq 0 $((n - 1))); do
    place_rank "$r"
    "${PLACE_WRAP[@]}" timeout "${TRAINER_TIMEOUT:-300}" "$BIN/examples/tessera-llama-trainer" \
      --agent_socket="$SOCK_DIR/$job-$r.sock" "$@" >"$DIR/logs/trainer-$job-$r.out" 2>&1 &
    TRAINER_PIDS+=($!)
  done
  for p in "${TRAINER_PIDS[@]}"; do wait "$p" || rc=1; done
  return $rc
}

# stop_agents: SIGTERM every agent; returns non-zero if one did not exit 0 in time.
stop_agents() {
  local rc=0 p
  for p in "${AGENT_PIDS[@]}"; do stop_process "$p" 10 || rc=1; done
  AGENT_PIDS=()
  return $rc
}

stop_coordinator() {
  [ -n "$COORD_PID" ] || return 0
  stop_process "$COORD_PID" 10
  local rc=$?
  COORD_PID=""
  return $rc
}

# start_local_s3 BUCKET [tessera-local-s3 flags...]: a SeaweedFS S3 server on loopback
# ($BIN/storage/s3/testing/tessera-local-s3; TESSERA_WEED names the venv's weed) with BUCKET
# made; exports the AWS_* environment the coordinator, agents and CLI started afterwards reach it
# with (and TESSERA_LOCAL_S3_*: weed's pid, its master's URL), and sets
# STORAGE_ROOT=s3://BUCKET/ckpt. Bounded: fails if S3 does not work within 90 s.
LOCAL_S3_PID=""
start_local_s3() {
  local bucket=$1 env_file="$DIR/local-s3.env" waited=0
  shift
  mkdir -p "$DIR/logs" "$DIR/s3"
  rm -f "$env_file"
  "$BIN/storage/s3/testing/tessera-local-s3" --dir="$DIR/s3" --bucket="$bucket" \
    --env_file="$env_file" "$@" 2>>"$DIR/logs/local-s3.log" &
  LOCAL_S3_PID=$!
  until [ -f "$env_file" ]; do
    kill -0 "$LOCAL_S3_PID" 2>/dev/null || { echo "S3 did not start; see $DIR/logs/local-s3.log" >&2; return 1; }
    sleep 0.1
    waited=$((waited + 1))
    [ $waited -lt 900 ] || { echo "S3 was not ready in 90 s" >&2; return 1; }
  done
  # shellcheck disable=SC1090
  source "$env_file"
  STORAGE_ROOT="s3://$bucket/ckpt"
}

# stop_all: for EXIT traps. Never fails: under `set -e` a failing command in a trap would
# replace the script's exit status.
stop_all() {
  local p
  for p in "${TRAINER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  stop_agents >/dev/null 2>&1 || true
  stop_coordinator >/dev/null 2>&1 || true
  [ -z "$LOCAL_S3_PID" ] || stop_process "$LOCAL_S3_PID" 10 >/dev/null 2>&1 || true
  case "$SOCK_DIR" in /tmp/tessera-sock.*) rm -rf "$SOCK_DIR" ;; esac
  return 0
}

# fail MESSAGE...: ends a test run: prints "FAIL: MESSAGE" and the last FAIL_TAIL lines
# (default 10) of every trainer output and process log under $DIR/logs, then exits 1. A script
# that shows something else defines its own fail after sourcing this file.
fail() {
  echo "FAIL: $*"
  tail -n "${FAIL_TAIL:-10}" "$DIR"/logs/*.out "$DIR"/logs/*.log 2>/dev/null
  exit 1
}
