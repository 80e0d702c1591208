#!/usr/bin/env bash
# The GPU rows of overlapped saves in one command (tests/gpu/overlap_gpu.py): a coordinator and
# one agent (job "gpuov", dp=1) on loopback from BIN, then the script against them; results in
# OUT (default ./gpu-overlap-results): overlap.json and the logs.
#
#   tests/gpu/overlap.sh [--bin=DIR] [--gib=1,8] [--steps=12] [--out=DIR]
#
# BIN (default .bazel/bin, else bazel-bin) holds agent/tessera-agent,
# server/tessera-coordinator and client/python/site (the tessera package with its extension),
# built for this machine's Python (bazel build //agent:tessera-agent
# //server:tessera-coordinator //client/python:site). Needs a GPU and a PyTorch with CUDA.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=""
GIB=1,8
STEPS=12
OUT=${OUT:-$PWD/gpu-overlap-results}
for arg in "$@"; do
  case "$arg" in
    --bin=*) BIN=${arg#*=} ;;
    --gib=*) GIB=${arg#*=} ;;
    --steps=*) STEPS=${arg#*=} ;;
    --out=*) OUT=${arg#*=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "overlap.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$BIN" ] || for b in .bazel/bin bazel-bin; do [ -x "$b/agent/tessera-agent" ] && BIN=$b && break; done
[ -x "$BIN/agent/tessera-agent" ] || { echo "overlap.sh: no agent under '$BIN' (see --help)" >&2; exit 1; }
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 ||
  { echo "overlap.sh: no GPU (nvidia-smi sees none): the GPU rows are not run" >&2; exit 1; }
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
DIR=$OUT/run
mkdir -p "$DIR/logs"
trap stop_all EXIT
start_coordinator || { echo "overlap.sh: the coordinator did not start ($DIR/logs)" >&2; exit 1; }
start_agents gpuov dp=1 || { echo "overlap.sh: the agent did not start ($DIR/logs)" >&2; exit 1; }
PYTHONPATH="$BIN/client/python/site${PYTHONPATH:+:$PYTHONPATH}" \
  python3 -P tests/gpu/overlap_gpu.py --agent="$SOCK_DIR/gpuov-0.sock" --gib="$GIB" \
  --steps="$STEPS" --dcp_dir="$DIR/dcp" --out="$OUT/overlap.json"
rc=$?
stop_agents
stop_coordinator
rm -rf "$DIR/dcp" "$DIR/ckpt"
exit $rc
