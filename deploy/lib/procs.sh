# Process helpers shared by deploy/quickstart.sh and the end-to-end tests (source it).
# Every wait is bounded; nothing here waits forever.

# wait_for_line FILE REGEX TIMEOUT_S: waits until FILE has a line matching REGEX.
wait_for_line() {
  local file=$1 regex=$2 timeout=$3 waited=0
  while ! grep -Eq -- "$regex" "$file" 2>/dev/null; do
    if [ "$waited" -ge $((timeout * 10)) ]; then
      echo "timed out after ${timeout}s waiting for /$regex/ in $file" >&2
      return 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

# count_lines FILE REGEX: number of lines of FILE matching REGEX (0 if FILE does not exist).
count_lines() {
  local n
  n=$(grep -Ec -- "$2" "$1" 2>/dev/null)
  echo "${n:-0}"
}

# bound_port LOG: the port a coordinator started with --listen=HOST:0 reported.
bound_port() { sed -nE 's/.*listening on .* \(port ([0-9]+)\).*/\1/p' "$1" | tail -n 1; }

# stop_process PID TIMEOUT_S: SIGTERM, wait up to TIMEOUT_S, then SIGKILL. Returns the exit
# status, or 124 if it had to be killed.
stop_process() {
  local pid=$1 timeout=$2 waited=0
  kill -TERM "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return $?; }
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge $((timeout * 10)) ]; then
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  wait "$pid" 2>/dev/null
}

# log_offset FILE: FILE's size in bytes now (0 if it does not exist). A restarted process
# appends to the same log; log_since and wait_for_line_since read only what came after.
log_offset() { stat -c %s "$1" 2>/dev/null || echo 0; }

# log_since FILE OFFSET: what FILE got after OFFSET (a log_offset).
log_since() { tail -c +"$(($2 + 1))" "$1" 2>/dev/null; }

# wait_for_line_since FILE OFFSET REGEX TIMEOUT_S: as wait_for_line, in what FILE got after
# OFFSET.
wait_for_line_since() {
  local file=$1 offset=$2 regex=$3 timeout=$4 waited=0
  until log_since "$file" "$offset" | grep -Eq -- "$regex"; do
    if [ "$waited" -ge $((timeout * 10)) ]; then
      echo "timed out after ${timeout}s waiting for /$regex/ in $file (after byte $offset)" >&2
      return 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}
