#!/usr/bin/env bash
# Tessera benchmarks: every figure as a ratio against a baseline measured in the same run, on
# the same machine and the same disk (issue 7; targets in DESIGN.md "Performance targets").
# Not a pass/fail test: it always exits 0 when it could measure, and reports whether each
# target was met. Run it on a quiet machine.
#
#   ./tests/bench/run.sh                          all figures, default sizes
#   ./tests/bench/run.sh --sizes=64M --ranks=1,2 --plan=2x2x2:12 --plan-repeats=1   (quick)
#   ./tests/bench/run.sh --reference=<machine>    also write docs/benchmarks/reference-<machine>.{md,png}
#
# Figures (results.md explains each row):
#   1 stall    save() blocked time / memcpy of the same bytes into pre-faulted memory
#   2 persist  bytes / (first save() call -> last rank sees COMMITTED) vs fio sequential write
#   3 peer     torch.save per rank + fsync vs Tessera: blocked time and time to durable
#   3c dcp     PyTorch DCP on the same state and ranks (dcp_peer.py): save, async_save, and
#              async_save with its pinned staging options, vs Tessera: stall and time to durable
#   4 load     bytes / load time onto another TP degree vs fio sequential read, caches dropped
#   4b dcp     dcp.load of DCP's checkpoint onto the same other world size, caches dropped
#   4m memory  restore from memory: right after the saves, the same layout loads the last step
#              from its agents' memory tier, vs the memcpy of the same bytes; with 2+ ranks,
#              the odd ranks' "node" is then lost and they restore on a new one from their
#              buddies' copies, vs loopback TCP bandwidth (link_bw.py)
#   5 plan     fake agents (in worker processes) through a real coordinator over gRPC: first
#              and cached plan time, coordinator peak RSS (VmHWM), manifest size and load time;
#              1,024 x 1,000 and 16,384 x 300 judged, and a sweep of rank counts at 300 shards
#   6 gpu      only where nvidia-smi sees a GPU (else a "skipped: no GPU" row)
#
# Options (environment variable in brackets):
#   --sizes=256M,1G,4G     MiB per rank, suffix M or G          [TESSERA_BENCH_SIZES]
#   --ranks=1,4            rank counts                          [TESSERA_BENCH_RANKS]
#   --steps=3              saves per configuration (step 1 plans from scratch; the stall and
#                          persist figures use the median of the later, steady-state steps)
#                                                               [TESSERA_BENCH_STEPS]
#   --plan=4x8x32:1000,... planning configurations PPxTPxDP[:SHARDS[:whole]]
#                          [TESSERA_BENCH_PLAN]; ":whole": agents re-send whole plans (no
#                          fingerprints), the baseline of the cached figure (default: 1,024 x
#                          1,000 and 16,384 x 300 both ways, and 128 ... 8,192 x 300)
#   --plan-shards=1000     shards per rank where a configuration names none
#                                                                [TESSERA_BENCH_PLAN_SHARDS]
#   --plan-repeats=3       runs of each planning configuration   [TESSERA_BENCH_PLAN_REPEATS]
#   --fio-size=4G          fio file size (default: the largest configuration's total bytes,
#                          at least 1 GiB, at most 8 GiB)         [TESSERA_BENCH_FIO_SIZE]
#   --only=stall,plan,...  run only these figures (stall covers 1-3, dcp 3c and 4b, load is
#                          4, memory 4m, plan 5, gpu 6)
#   --data-dir=DIR         where checkpoints and the fio file go (the disk measured; default
#                          <results>/data, removed at the end)  [TESSERA_BENCH_DATA_DIR]
#   --out=DIR              results directory (default tests/bench/results/<timestamp>; also
#                          linked as tests/bench/results/latest)
#   --reference=NAME       also copy results.md / chart.png to docs/benchmarks/reference-NAME.*
#   --no-build             use binaries already built (with --bin=DIR: a bazel-bin directory)
#   --bazel="bazel --output_base=..."  the Bazel command line to build and locate binaries
#                                                               [TESSERA_BENCH_BAZEL]
#   GPU figure: TESSERA_BENCH_GPU_SIZE (default 1G of CUDA tensors), TESSERA_BENCH_GPU_PYTHON
#   (default: the Python environment below; must be the Python 3.11 the module was built for,
#   with a CUDA PyTorch — 2.x for the DCP async_save side).
#   The trainer ranks run under the Python environment of deploy/install-deps.sh
#   (TESSERA_VENV, default .venv: the pinned torch).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
source deploy/lib/procs.sh

SIZES=${TESSERA_BENCH_SIZES:-256M,1G,4G}
RANKS=${TESSERA_BENCH_RANKS:-1,4}
STEPS=${TESSERA_BENCH_STEPS:-3}
PLAN=${TESSERA_BENCH_PLAN:-4x8x32:1000,4x8x32:1000:whole,16x8x128:300,16x8x128:300:whole,2x8x8:300,4x8x16:300,4x8x32:300,8x8x64:300,8x8x128:300}
PLAN_REPEATS=${TESSERA_BENCH_PLAN_REPEATS:-3}
PLAN_SHARDS=${TESSERA_BENCH_PLAN_SHARDS:-1000}
FIO_SIZE=${TESSERA_BENCH_FIO_SIZE:-}
DATA_DIR=${TESSERA_BENCH_DATA_DIR:-}
BAZEL=${TESSERA_BENCH_BAZEL:-bazel}
ONLY=stall,dcp,load,memory,plan,gpu
OUT=""
REFERENCE=""
BUILD=1
BIN=""
for arg in "$@"; do
  case "$arg" in
    --sizes=*) SIZES=${arg#*=} ;;
    --ranks=*) RANKS=${arg#*=} ;;
    --steps=*) STEPS=${arg#*=} ;;
    --plan=*) PLAN=${arg#*=} ;;
    --plan-shards=*) PLAN_SHARDS=${arg#*=} ;;
    --plan-repeats=*) PLAN_REPEATS=${arg#*=} ;;
    --fio-size=*) FIO_SIZE=${arg#*=} ;;
    --only=*) ONLY=${arg#*=} ;;
    --data-dir=*) DATA_DIR=${arg#*=} ;;
    --out=*) OUT=${arg#*=} ;;
    --reference=*) REFERENCE=${arg#*=} ;;
    --no-build) BUILD=0 ;;
    --bin=*) BIN=${arg#*=} ;;
    --bazel=*) BAZEL=${arg#*=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
wants() { [[ ",$ONLY," == *",$1,"* ]]; }
say() { echo "bench: $*" >&2; }
# to_mib 256M|1G|64 -> MiB
to_mib() {
  case "$1" in
    *G|*g) echo $(( ${1%?} * 1024 )) ;;
    *M|*m) echo "${1%?}" ;;
    *) echo "$1" ;;
  esac
}

STAMP=$(date +%Y%m%d-%H%M%S)
OUT=${OUT:-tests/bench/results/$STAMP}
mkdir -p "$OUT/raw" "$OUT/logs" || exit 1
OUT=$(cd "$OUT" && pwd)
if [[ "$OUT" == "$ROOT/tests/bench/results/"* ]]; then
  ln -sfn "$OUT" "$ROOT/tests/bench/results/latest"
fi
DATA_DIR=${DATA_DIR:-$OUT/data}
mkdir -p "$DATA_DIR" || exit 1
DATA_DIR=$(cd "$DATA_DIR" && pwd)
say "results in $OUT; data (the disk measured) in $DATA_DIR"

# --- Build
if [ "$BUILD" = 1 ]; then
  ./deploy/install-deps.sh --quiet || exit 1
  say "building"
  $BAZEL build //server:tessera-coordinator //agent:tessera-agent //client/python:site \
    //tests/bench:tessera-plan-load >"$OUT/logs/build.log" 2>&1 \
    || { tail -n 30 "$OUT/logs/build.log" >&2; exit 1; }
fi
BIN=${BIN:-$($BAZEL info bazel-bin 2>/dev/null)}
for b in server/tessera-coordinator agent/tessera-agent client/python/site/tessera/_tessera.so; do
  [ -e "$BIN/$b" ] || { echo "run.sh: $BIN/$b is missing (build first)" >&2; exit 1; }
done
export PYTHONPATH="$BIN/client/python/site"
VENV_PYTHON=${TESSERA_VENV:-$ROOT/.venv}/bin/python
[ -x "$VENV_PYTHON" ] || { echo "run.sh: no Python environment at $VENV_PYTHON (run deploy/install-deps.sh)" >&2; exit 1; }
PY="$VENV_PYTHON -P"

# --- The machine (results.md's header)
{
  echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  echo "cores=$(nproc)"
  echo "mem_kib=$(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo)"
  echo "mem_available_kib=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)"
  src=$(df --output=source "$DATA_DIR" | tail -n 1)
  echo "disk_source=$src"
  dev=$(basename "$(readlink -f "$src" 2>/dev/null || echo "$src")")
  parent=$(lsblk -no PKNAME "/dev/$dev" 2>/dev/null | head -n 1)
  model=$(cat "/sys/block/${parent:-$dev}/device/model" 2>/dev/null | xargs)
  rot=$(cat "/sys/block/${parent:-$dev}/queue/rotational" 2>/dev/null)
  size=$(lsblk -dno SIZE "/dev/${parent:-$dev}" 2>/dev/null | xargs)
  echo "disk=/dev/${parent:-$dev}${model:+ ($model)}${size:+, $size}${rot:+, rotational=$rot}"
  echo "fs=$(df --output=fstype "$DATA_DIR" | tail -n 1)"
  echo "data_dir=$DATA_DIR"
  echo "kernel=$(uname -srm)"
  echo "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo "+changes")"
  echo "torch=$($VENV_PYTHON -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  echo "fio=$(fio --version 2>/dev/null)"
  echo "args=$*"
} >"$OUT/raw/machine.env"

# drop_caches: drops the page cache if we may (root); echoes what was done.
drop_caches() {
  sync
  if [ -w /proc/sys/vm/drop_caches ] && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
    echo dropped
  else
    echo "not dropped (not root)"
  fi
}

# --- Configurations and what fits
wants stall || wants load || wants dcp || wants memory || SIZES=""
IFS=',' read -ra size_list <<<"$SIZES"
IFS=',' read -ra rank_list <<<"$RANKS"
mem_avail_mib=$(( $(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo) / 1024 ))
largest_total=0
: >"$OUT/raw/configs.txt"
for s in "${size_list[@]}"; do
  mib=$(to_mib "$s")
  for r in "${rank_list[@]}"; do
    # Per rank at the peak: its tensors + its agent's staging + the memcpy baseline buffer; the
    # load needs the same per loader; plus 1 GiB for the processes themselves.
    need=$(( 3 * mib * r + 1024 ))
    if [ "$need" -le "$mem_avail_mib" ]; then
      echo "$mib $r run $need" >>"$OUT/raw/configs.txt"
      [ $((mib * r)) -gt "$largest_total" ] && largest_total=$((mib * r))
    else
      echo "$mib $r skip $need" >>"$OUT/raw/configs.txt"
      say "not run: $mib MiB x $r ranks needs $need MiB of memory, $mem_avail_mib MiB available"
    fi
  done
done

# --- fio: the disk's sequential write and read bandwidth in DATA_DIR
# Two ways, and the faster is the disk's bandwidth: one 4 MiB request at a time (psync), and
# four in flight (libaio, iodepth 4) — Tessera's writer and reader keep several in flight, so
# a one-deep fio alone would understate what the disk can do.
FIO_COMMON="--directory=$DATA_DIR --filename=fio-seq.dat --bs=4M --direct=1 --numjobs=1"
FIO_MODES=("psync:--ioengine=psync" "libaio4:--ioengine=libaio --iodepth=4")
if wants stall || wants load; then
  fio_mib=$(to_mib "${FIO_SIZE:-$(( largest_total < 1024 ? 1024 : (largest_total > 8192 ? 8192 : largest_total) ))M}")
  say "fio: sequential write and read of $fio_mib MiB in $DATA_DIR (psync and libaio iodepth=4)"
  echo "$FIO_COMMON --size=${fio_mib}M, each with --ioengine=psync and with --ioengine=libaio --iodepth=4 (the faster counts); write: --rw=write --end_fsync=1; read: --rw=read after drop_caches" \
    >"$OUT/raw/fio-options.txt"
  : >"$OUT/logs/fio.log"
  for mode in "${FIO_MODES[@]}"; do
    tag=${mode%%:*}
    # shellcheck disable=SC2086  # the options are words
    fio --name=seqwrite $FIO_COMMON ${mode#*:} --size="${fio_mib}M" --rw=write --end_fsync=1 \
      --output-format=json --output="$OUT/raw/fio-write-$tag.json" >>"$OUT/logs/fio.log" 2>&1 \
      || say "fio write ($tag) failed (see $OUT/logs/fio.log)"
    echo "$(drop_caches)" >"$OUT/raw/fio-read-cache.txt"
    # shellcheck disable=SC2086
    fio --name=seqread $FIO_COMMON ${mode#*:} --size="${fio_mib}M" --rw=read \
      --output-format=json --output="$OUT/raw/fio-read-$tag.json" >>"$OUT/logs/fio.log" 2>&1 \
      || say "fio read ($tag) failed (see $OUT/logs/fio.log)"
  done
  rm -f "$DATA_DIR/fio-seq.dat"
fi

# --- Figures 1-4: one cluster per configuration
source deploy/lib/cluster.sh
LEASE_MS=2000
RANK_PIDS=()
bench_stop_all() {
  local p
  for p in "${RANK_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  stop_all
}
trap bench_stop_all EXIT

# run_ranks MODE JOB WORLD OUTPREFIX [bench_rank.py args...]: one process per rank; waits.
run_ranks() {
  local mode=$1 job=$2 world=$3 prefix=$4 r rc=0
  shift 4
  RANK_PIDS=()
  for r in $(seq 0 $((world - 1))); do
    timeout 3600 $PY tests/bench/bench_rank.py "$mode" --agent="$SOCK_DIR/$job-$r.sock" \
      --rank="$r" --world="$world" --out="$prefix-$r.json" "$@" \
      </dev/null >"$DIR/logs/$mode-$r.out" 2>&1 &
    RANK_PIDS+=($!)
  done
  for p in "${RANK_PIDS[@]}"; do wait "$p" || rc=1; done
  RANK_PIDS=()
  return $rc
}

# run_dcp MODE WORLD OUTPREFIX [dcp_peer.py args...]: PyTorch DCP's ranks (dcp_peer.py) on the
# configuration's state; waits. Their checkpoints go to $DIR/dcp.
run_dcp() {
  local mode=$1 world=$2 prefix=$3 r rc=0
  shift 3
  RANK_PIDS=()
  for r in $(seq 0 $((world - 1))); do
    PYTHONPATH="$PYTHONPATH:$ROOT/tests/bench" timeout 3600 $PY tests/bench/dcp_peer.py "$mode" \
      --rank="$r" --world="$world" --barrier="$DIR/barrier-dcp-$mode" --dir="$DIR/dcp" \
      --rdzv="$DIR/rdzv-dcp-$mode" --out="$prefix-$r.json" "$@" \
      </dev/null >"$DIR/logs/dcp-$mode-$r.out" 2>&1 &
    RANK_PIDS+=($!)
  done
  for p in "${RANK_PIDS[@]}"; do wait "$p" || rc=1; done
  RANK_PIDS=()
  return $rc
}

if wants stall || wants load || wants dcp || wants memory; then
  while read -r mib r verdict need <&3; do
    [ "$verdict" = run ] || continue
    tag="${mib}M-x$r"
    DIR="$DATA_DIR/run-$tag"
    rm -rf "$DIR"
    mkdir -p "$DIR/logs"
    job="bench$r"
    say "== $mib MiB per rank x $r ranks: ${STEPS} Tessera saves (tp=$r), torch.save, load"
    COORD_PORT=""
    metrics_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if ! start_coordinator --metrics_listen="127.0.0.1:$metrics_port"; then
      say "$tag: the coordinator did not start"; cp -r "$DIR/logs" "$OUT/logs/$tag"; continue
    fi
    # Figure 4m's buddy restore needs two nodes: even ranks on bench-n0, odd ones on bench-n1.
    place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=bench-n$(($1 % 2)); }
    if ! start_agents "$job" "tp=$r"; then
      say "$tag: agents did not register"; stop_all; cp -r "$DIR/logs" "$OUT/logs/$tag"; continue
    fi
    if ! run_ranks save "$job" "$r" "$OUT/raw/save-$tag" --mib="$mib" --steps="$STEPS" \
        --barrier="$DIR/barrier-save" --torch-dir="$DIR/torch"; then
      say "$tag: a save rank failed (logs in $OUT/logs/$tag)"
    fi
    # The coordinator's phase durations (tessera_phase_seconds): the persist-phase row.
    /usr/bin/python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(
      "http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode())' "$metrics_port" \
      >"$OUT/raw/metrics-$tag.txt" 2>/dev/null || say "$tag: no metrics from the coordinator"
    if wants memory; then
      # The agents still hold the last step: the same layout loads it from memory.
      run_ranks load "$job" "$r" "$OUT/raw/memload-$tag" --mib="$mib" --saved-world="$r" \
        --barrier="$DIR/barrier-memload" || say "$tag: a memory load rank failed (logs in $OUT/logs/$tag)"
      if [ "$r" -gt 1 ]; then
        # Node bench-n1 is lost once its ranks' buddies on bench-n0 hold the last step; its
        # ranks start again on bench-n2 and load it: their files come from the buddies.
        held=1
        for q in $(seq 1 2 $((r - 1))); do
          wait_for_line "$DIR/logs/agent-$job-$q.log" "memory copy of step $STEPS .*sent to buddy" 120 ||
            { say "$tag: rank $q's buddy copy of step $STEPS was not sent"; held=0; }
        done
        if [ "$held" = 1 ]; then
          place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=bench-n$(($1 % 2 == 0 ? 0 : 2)); }
          for q in $(seq 1 2 $((r - 1))); do
            kill -KILL "${AGENT_PIDS[$q]}" 2>/dev/null; wait "${AGENT_PIDS[$q]}" 2>/dev/null
            mark_agent_log "$job" "$q"
            start_agent "$job" "tp=$r" "$q"
          done
          for q in $(seq 1 2 $((r - 1))); do
            wait_registered "$job" "$q" || say "$tag: rank $q's replacement did not register"
          done
          $PY tests/bench/link_bw.py --streams=$((r / 2)) --mib="$mib" >"$OUT/raw/link-$tag.json" \
            2>>"$OUT/logs/link.log" || say "$tag: loopback bandwidth not measured"
          run_ranks load "$job" "$r" "$OUT/raw/buddyload-$tag" --mib="$mib" --saved-world="$r" \
            --barrier="$DIR/barrier-buddyload" || say "$tag: a buddy restore rank failed (logs in $OUT/logs/$tag)"
        fi
        place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=""; }
      fi
    fi
    stop_agents >/dev/null 2>&1
    place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=""; }
    rm -rf "$DIR/torch"
    if wants dcp; then
      say "$tag: PyTorch DCP on the same state and ranks: save, async_save (${STEPS} each)"
      run_dcp save "$r" "$OUT/raw/dcp-save-$tag" --mib="$mib" --steps="$STEPS" ||
        say "$tag: a DCP save rank failed (logs in $OUT/logs/$tag)"
    fi
    if wants load; then
      lr=$(( r > 1 ? r / 2 : 2 ))
      if start_agents "$job" "tp=$lr"; then
        echo "$(drop_caches)" >"$OUT/raw/load-cache-$tag.txt"
        echo "$r $lr" >"$OUT/raw/load-layout-$tag.txt"
        run_ranks load "$job" "$lr" "$OUT/raw/load-$tag" --mib="$mib" \
          --saved-world="$r" --barrier="$DIR/barrier-load" \
          || say "$tag: a load rank failed (logs in $OUT/logs/$tag)"
        stop_agents >/dev/null 2>&1
      else
        say "$tag: load agents did not register"
      fi
      if wants dcp; then
        echo "$(drop_caches)" >"$OUT/raw/dcp-load-cache-$tag.txt"
        run_dcp load "$lr" "$OUT/raw/dcp-load-$tag" --mib="$mib" --saved-world="$r" \
          --steps="$STEPS" || say "$tag: a DCP load rank failed (logs in $OUT/logs/$tag)"
      fi
    fi
    rm -rf "$DIR/dcp"
    stop_coordinator >/dev/null 2>&1
    cp -r "$DIR/logs" "$OUT/logs/$tag"
    rm -rf "$DIR"
  done 3<"$OUT/raw/configs.txt"
fi

# --- Figure 5: planning through the real coordinator
# Each configuration MESH:SHARDS (pp x tp x dp ranks, shards per rank) runs PLAN_REPEATS times,
# each with a fresh coordinator: raw/plan-<config>-<i>.json and plan-events-<config>-<i>.txt.
if wants plan; then
  IFS=',' read -ra plan_configs <<<"$PLAN"
  for config in "${plan_configs[@]}"; do
    IFS=':' read -r mesh shards protocol <<<"$config"
    shards=${shards:-$PLAN_SHARDS}
    fingerprints=true
    [ "$protocol" = whole ] && fingerprints=false
    IFS='x' read -r ppd tpd dpd <<<"$mesh"
    for i in $(seq 1 "$PLAN_REPEATS"); do
      tag="$mesh-$shards${protocol:+-$protocol}-$i"
      say "== planning $i/$PLAN_REPEATS: pp=$ppd x tp=$tpd x dp=$dpd ranks x $shards shards, real coordinator"
      DIR="$DATA_DIR/plan"
      rm -rf "$DIR"
      mkdir -p "$DIR/logs"
      COORD_PORT=""
      # Leases long enough that thousands of fake agents heartbeating from a few processes on
      # a loaded machine never expire: this figure is about planning, not leases.
      LEASE_MS=600000
      if start_coordinator --heartbeat_interval_ms=5000; then
        timeout 1800 "$BIN/tests/bench/tessera-plan-load" --coordinator="127.0.0.1:$COORD_PORT" \
          --coordinator_pid="$COORD_PID" --pp="$ppd" --tp="$tpd" --dp="$dpd" \
          --shards_per_rank="$shards" --fingerprints="$fingerprints" >"$OUT/raw/plan-$tag.json" 2>"$OUT/logs/plan-load-$tag.log" \
          || say "planning failed (see $OUT/logs/plan-load-$tag.log)"
        grep -E "plan (validated|reused)|plan of job .* built|commands handed to the streams" "$DIR/logs/coordinator.log" \
          >"$OUT/raw/plan-events-$tag.txt"
        stop_coordinator >/dev/null 2>&1
      else
        say "planning: the coordinator did not start"
      fi
      LEASE_MS=2000
      cp "$DIR/logs/coordinator.log" "$OUT/logs/plan-coordinator-$tag.log" 2>/dev/null
      rm -rf "$DIR"
    done
  done
fi

# --- Figure 6: GPU
if wants gpu; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$OUT/raw/gpu.txt" 2>&1; then
    gpu_mib=$(to_mib "${TESSERA_BENCH_GPU_SIZE:-1G}")
    say "== GPU: $gpu_mib MiB of CUDA tensors, 1 rank: D2H baseline, Tessera, DCP async_save"
    DIR="$DATA_DIR/gpu"
    rm -rf "$DIR"
    mkdir -p "$DIR/logs"
    COORD_PORT=""
    if start_coordinator && start_agents benchgpu "tp=1"; then
      PY="${TESSERA_BENCH_GPU_PYTHON:-$VENV_PYTHON} -P" run_ranks gpu benchgpu 1 \
        "$OUT/raw/gpu" --mib="$gpu_mib" --steps="$STEPS" --barrier="$DIR/barrier" \
        --torch-dir="$DIR/torch" || say "GPU: the rank failed (see $OUT/logs/gpu)"
    else
      say "GPU: the cluster did not start"
    fi
    stop_agents >/dev/null 2>&1
    stop_coordinator >/dev/null 2>&1
    cp -r "$DIR/logs" "$OUT/logs/gpu"
    rm -rf "$DIR"
  else
    echo "skipped: no GPU (nvidia-smi absent or sees none)" >"$OUT/raw/gpu.txt"
  fi
fi

[ "$DATA_DIR" = "$OUT/data" ] && rm -rf "$DATA_DIR"

# --- Report
/usr/bin/python3 tests/bench/report.py "$OUT" --steps="$STEPS" --data-dir="$DATA_DIR" || exit 1
if [ -n "$REFERENCE" ]; then
  mkdir -p docs/benchmarks
  sed "s|chart.png|reference-$REFERENCE.png|; s|plan.png|reference-$REFERENCE-plan.png|" \
    "$OUT/results.md" >"docs/benchmarks/reference-$REFERENCE.md"
  [ -f "$OUT/chart.png" ] && cp "$OUT/chart.png" "docs/benchmarks/reference-$REFERENCE.png"
  [ -f "$OUT/plan.png" ] && cp "$OUT/plan.png" "docs/benchmarks/reference-$REFERENCE-plan.png"
  say "reference written: docs/benchmarks/reference-$REFERENCE.md"
fi
cat "$OUT/results.md"
