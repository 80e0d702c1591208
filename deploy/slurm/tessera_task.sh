#!/bin/bash
# One Slurm task of tessera_job.sbatch: starts the tessera-agent of rank $SLURM_PROCID in the
# background, runs the trainer command ("$@") with TESSERA_AGENT set to the agent's socket,
# then stops the agent (SIGTERM) and exits with the trainer's status.
#
# Needs TESSERA_COORDINATOR, TESSERA_JOB, TESSERA_LAYOUT (exported by tessera_job.sbatch);
# optional TESSERA_BIN, TESSERA_AGENT_FLAGS, TESSERA_LOG_DIR. The socket lives in
# ${TMPDIR:-/tmp}/tessera-<Slurm job id>/ (a unix socket path is limited to 107 bytes).
#
# The trainer should wait for its last save to commit (client.wait(step)) before it exits:
# the agent is stopped right after, and a save it has not finished aborts.
set -euo pipefail

: "${TESSERA_COORDINATOR:?}" "${TESSERA_JOB:?}" "${TESSERA_LAYOUT:?}" "${SLURM_PROCID:?}"
bin=${TESSERA_BIN:-/usr/local/bin}
rank=$SLURM_PROCID
log_dir=${TESSERA_LOG_DIR:-.}
sock_dir="${TMPDIR:-/tmp}/tessera-${SLURM_JOB_ID:-$$}"
socket="$sock_dir/agent-$rank.sock"
mkdir -p "$log_dir" "$sock_dir"
chmod 0700 "$sock_dir"

# shellcheck disable=SC2086  # TESSERA_AGENT_FLAGS is a list of flags
"$bin/tessera-agent" --coordinator="$TESSERA_COORDINATOR" --job="$TESSERA_JOB" \
  --rank="$rank" --layout="$TESSERA_LAYOUT" --socket="$socket" \
  --node_id="${SLURMD_NODENAME:-$(hostname)}" ${TESSERA_AGENT_FLAGS:-} \
  2>>"$log_dir/agent-$rank.log" &
agent=$!

stop_agent() {  # SIGTERM, 30 s, then SIGKILL; returns the agent's exit status
  local status=0
  kill -TERM "$agent" 2>/dev/null || { wait "$agent" 2>/dev/null || status=$?; return "$status"; }
  for _ in $(seq 300); do
    kill -0 "$agent" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$agent" 2>/dev/null || true
  wait "$agent" 2>/dev/null || status=$?
  return "$status"
}

for _ in $(seq 600); do  # the agent's socket, 60 s at most
  [ -S "$socket" ] && break
  if ! kill -0 "$agent" 2>/dev/null; then
    echo "rank $rank: tessera-agent exited; see $log_dir/agent-$rank.log" >&2
    exit 1
  fi
  sleep 0.1
done
[ -S "$socket" ] || { echo "rank $rank: no agent socket after 60 s" >&2; stop_agent || true; exit 1; }

export TESSERA_AGENT=$socket
export RANK=$rank WORLD_SIZE=${SLURM_NTASKS:-1} LOCAL_RANK=${SLURM_LOCALID:-0}
trainer_rc=0
"$@" || trainer_rc=$?
agent_rc=0
stop_agent || agent_rc=$?
rmdir "$sock_dir" 2>/dev/null || true
if [ "$agent_rc" -ne 0 ]; then
  echo "rank $rank: tessera-agent exited with $agent_rc; see $log_dir/agent-$rank.log" >&2
fi
exit "$trainer_rc"
