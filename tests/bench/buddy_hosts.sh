#!/usr/bin/env bash
# Figure 4m's buddy restore across hosts whose link is the limit: the coordinator and the agents
# on simulated hosts (tests/hosts/lib.sh: network namespaces, veth to a bridge), every host's
# link shaped to RATE each way with tc tbf. tp=4, SIZE per rank: ranks 0 and 2 on host a, 1
# and 3 on host b, each the other host's memory buddy. Host b is lost (its agents SIGKILLed);
# ranks 1 and 3 start again on host c, a node that holds nothing, and load the last step: their
# bytes come from the buddy copies on host a, across a's link and c's. Per run, right before
# the restore, the baseline: a plain TCP stream from a to c over the same links, one connection
# per restoring rank, the same bytes (tests/bench/link_stream.py). The ratio is the restore's
# bytes from buddies / (first load() call -> last returned) over the stream's bytes / its time;
# the target is >= 0.80. Each restore checks every byte it receives (XXH3-64); the stream
# checks nothing.
#
# Root only (namespaces, tc). Build first: bazel build //server:tessera-coordinator
# //agent:tessera-agent //client/python:site //client/cli:tessera; the Python environment of
# deploy/install-deps.sh (.venv).
#
#   tests/bench/buddy_hosts.sh [--rate=2gbit] [--mib=256] [--runs=3] [--out=DIR]
#
# Prints one line per run and the median run's row; JSON of every rank and stream in OUT.
set -uo pipefail
RATE=2gbit
MIB=256
RUNS=3
OUT=""
for arg in "$@"; do
  case "$arg" in
    --rate=*) RATE=${arg#*=} ;;
    --mib=*) MIB=${arg#*=} ;;
    --runs=*) RUNS=${arg#*=} ;;
    --out=*) OUT=${arg#*=} ;;
    *) echo "buddy_hosts.sh: unknown argument $arg (see the header)" >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
source deploy/lib/procs.sh
source deploy/lib/cluster.sh
source tests/skip.sh
BIN=${BIN:-$(bazel info bazel-bin 2>/dev/null)}
PY="${TESSERA_VENV:-$ROOT/.venv}/bin/python -P"
export PYTHONPATH="$BIN/client/python/site"
OUT=${OUT:-$(mktemp -d /tmp/tessera-buddy-hosts.XXXXXX)}
DIR=$OUT/run
mkdir -p "$DIR/logs" "$OUT/raw"
JOB=bh$$
LAYOUT=tp=4
WORLD=4
HOSTS=(coord a b c)
declare -A ADDR=([coord]=10.77.0.1 [a]=10.77.0.11 [b]=10.77.0.12 [c]=10.77.0.13)
source tests/hosts/lib.sh
make_hosts
for h in a b c; do shape_link "$h" "$RATE"; done
echo "links of hosts a, b, c: tc tbf rate $RATE each way"
start_coordinator_on_coord

# ranks RANKS MODE PREFIX FLAGS...: bench_rank.py for each rank of RANKS on its host; waits.
ranks() {
  local list=$1 mode=$2 prefix=$3 r rc=0 pids=()
  shift 3
  for r in $list; do
    place_rank "$r"
    "${PLACE_WRAP[@]}" timeout 600 $PY tests/bench/bench_rank.py "$mode" \
      --agent="$SOCK_DIR/$JOB-$r.sock" --rank="$r" --world="$WORLD" --mib="$MIB" \
      --out="$prefix-$r.json" "$@" </dev/null >"$DIR/logs/$(basename "$prefix")-$r.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

RANK_HOSTS=(a b)
start_agents "$JOB" "$LAYOUT" || fail "agents"
ranks "0 1 2 3" save "$OUT/raw/save" --steps=2 --barrier="$DIR/barrier-save" --no-baselines \
  --torch-runs=0 || fail "saving on hosts a and b"
for q in 1 3; do
  wait_for_line "$DIR/logs/agent-$JOB-$q.log" "memory copy of step 2 .*sent to buddy" 120 ||
    fail "rank $q's buddy copy was not sent"
  kill -KILL "${AGENT_PIDS[$q]}" 2>/dev/null; wait "${AGENT_PIDS[$q]}" 2>/dev/null
done
echo "host b lost: ranks 1 and 3 start again on host c"
RANK_HOSTS=(a c)
for q in 1 3; do mark_agent_log "$JOB" "$q"; start_agent "$JOB" "$LAYOUT" "$q"; done
for q in 1 3; do wait_registered "$JOB" "$q" || fail "rank $q did not register on host c"; done

PORT=47000
for i in $(seq 1 "$RUNS"); do
  log="$DIR/logs/link-recv-$i.err"
  on c $PY tests/bench/link_stream.py recv --listen="${ADDR[c]}:$PORT" --streams=2 --mib="$MIB" \
    >"$OUT/raw/link-run$i.json" 2>"$log" &
  recv=$!
  wait_for_line "$log" listening 30 || fail "the stream's receiver did not start"
  on a $PY tests/bench/link_stream.py send --connect="${ADDR[c]}:$PORT" --streams=2 --mib="$MIB" ||
    fail "the stream's sender failed"
  wait "$recv" || fail "the stream's receiver failed: $(cat "$log")"
  ranks "1 3" load "$OUT/raw/buddy-run$i" --saved-world="$WORLD" --barrier="$DIR/barrier-load-$i" \
    --barrier-ranks=1,3 || fail "the restore on host c failed in run $i"
  PORT=$((PORT + 1))
done
stop_agents >/dev/null 2>&1
/usr/bin/python3 - "$OUT/raw" "$RUNS" "$RATE" <<'PY'
import json, os, sys
raw, runs, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for i in range(1, runs + 1):
    link = json.load(open(os.path.join(raw, "link-run%d.json" % i)))
    loads = [json.load(open(os.path.join(raw, "buddy-run%d-%d.json" % (i, r)))) for r in (1, 3)]
    assert not any(x["mismatched"] for x in loads), "run %d: a restored byte was wrong" % i
    fetched = sum(x["sources"]["bytes_fetched_from_peers"] for x in loads)
    disk = sum(x["sources"]["bytes_from_disk"] for x in loads)
    span = max(x["end"] for x in loads) - min(x["start"] for x in loads)
    bw, link_bw = fetched / span, link["bytes_per_s"]
    rows.append((bw / link_bw, i, fetched, disk, span, bw, link_bw))
    print("run %d: restore %.0f MiB from buddies (%d MiB from disk) in %.3f s = %.1f MiB/s; "
          "link %.1f MiB/s; ratio %.3f" % (i, fetched / 2**20, disk >> 20, span, bw / 2**20,
                                          link_bw / 2**20, bw / link_bw))
rows.sort()
ratio, i, fetched, disk, span, bw, link_bw = rows[(len(rows) - 1) // 2]
print("median run %d of %d: %.2f of the link (range %.2f-%.2f), target >= 0.80: %s" % (
    i, len(rows), ratio, rows[0][0], rows[-1][0], "met" if ratio >= 0.8 and disk == 0 else "missed"))
PY
