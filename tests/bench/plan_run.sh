# plan_run: one run of the planning benchmark (tests/bench/run.sh figure 5; the GPU machine's
# tests/gpu/on_device.sh --planning): a fresh coordinator in $DIR, tessera-plan-load's fake
# agents against it. Sourced; needs deploy/lib/cluster.sh's start_coordinator and
# stop_coordinator, $BIN and $DIR, and optionally PLAN_WRAP (a command prefix for the load tool,
# e.g. env LD_LIBRARY_PATH=...) and TESSERA_BENCH_PLAN_COORD_FLAGS (more coordinator flags,
# e.g. --hand_out_threads=1 for the fan-out on one thread).
#
#   plan_run TAG PP TP DP SHARDS FINGERPRINTS TIMEOUT_S RAW LOGS [tool flags...]
#
# Writes RAW/plan-TAG.json (the tool's report), RAW/plan-events-TAG.txt (the coordinator's
# planning log lines), LOGS/plan-load-TAG.log and LOGS/plan-coordinator-TAG.log; leaves $DIR
# (made afresh) to the caller. Returns 1, saying why on stderr, if the coordinator did not
# start or the tool failed. //tests/bench:plan_load_smoke_test runs it.
plan_run() {
  local tag=$1 pp=$2 tp=$3 dp=$4 shards=$5 fingerprints=$6 limit=$7 raw=$8 logs=$9
  shift 9
  local status=0
  rm -rf "$DIR"
  mkdir -p "$DIR/logs" "$raw" "$logs"
  COORD_PORT=""
  # Leases long enough that thousands of fake agents heartbeating from a few processes on a
  # loaded machine never expire: this measures planning, not leases (start_coordinator reads
  # this function's LEASE_MS).
  local LEASE_MS=600000
  local extra=()
  read -ra extra <<<"${TESSERA_BENCH_PLAN_COORD_FLAGS:-}"
  if start_coordinator --heartbeat_interval_ms=5000 ${extra[@]+"${extra[@]}"}; then
    if ! timeout "$limit" ${PLAN_WRAP[@]+"${PLAN_WRAP[@]}"} "$BIN/tests/bench/tessera-plan-load" \
        --coordinator="127.0.0.1:$COORD_PORT" --coordinator_pid="$COORD_PID" --pp="$pp" \
        --tp="$tp" --dp="$dp" --shards_per_rank="$shards" --fingerprints="$fingerprints" "$@" \
        >"$raw/plan-$tag.json" 2>"$logs/plan-load-$tag.log"; then
      echo "planning $tag failed (see plan-load-$tag.log)" >&2
      status=1
    fi
    grep -E "plan (validated|reused)|plan of job .* built|commands handed to the streams|written to the state store" \
      "$DIR/logs/coordinator.log" >"$raw/plan-events-$tag.txt"
    stop_coordinator >/dev/null 2>&1
  else
    echo "planning $tag: the coordinator did not start" >&2
    status=1
  fi
  cp "$DIR/logs/coordinator.log" "$logs/plan-coordinator-$tag.log" 2>/dev/null
  return $status
}
