# Process helpers shared by deploy/quickstart.sh and the end-to-end tests (source it).
# Every wait is bounded; nothing here waits forever.

# wait_until TIMEOUT_S COMMAND [ARGS...]: runs COMMAND every 0.1 s until it succeeds; returns
# 1 if it has not within TIMEOUT_S. The one poll loop of the shell tests: the events they wait
# for are lines in another process's log or a process's exit, which a shell cannot block on,
# so each wait checks for the event itself and is bounded — never a fixed sleep.
wait_until() {
  local timeout=$1 waited=0
  shift
  until "$@"; do
    [ "$waited" -lt $((timeout * 10)) ] || return 1
    sleep 0.1
    waited=$((waited + 1))
  done
}

# wait_for_line FILE REGEX TIMEOUT_S: waits until FILE has a line matching REGEX.
wait_for_line() {
  wait_until "$3" grep -Eq -- "$2" "$1" 2>/dev/null ||
    { echo "timed out after ${3}s waiting for /$2/ in $1" >&2; return 1; }
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
  local pid=$1 timeout=$2
  kill -TERM "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return $?; }
  if ! wait_until "$timeout" exited "$pid"; then
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
  fi
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
  wait_until "$4" _has_line_since "$1" "$2" "$3" ||
    { echo "timed out after ${4}s waiting for /$3/ in $1 (after byte $2)" >&2; return 1; }
}
_has_line_since() { log_since "$1" "$2" | grep -Eq -- "$3"; }

# exited PID: true once PID is gone.
exited() { ! kill -0 "$1" 2>/dev/null; }
