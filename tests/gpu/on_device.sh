#!/usr/bin/env bash
# The GPU run of issue 13, on the GPU machine, from the pack tests/gpu/run.sh built and the
# device tool carried (run it as `tests/gpu/run.sh --on-device`, which runs this copy from the
# pack). The image there has CUDA, PyTorch and Python but no Bazel, gRPC or RocksDB; every
# Tessera binary runs from the pack with LD_LIBRARY_PATH set for that process alone.
#
# Sections, in order; each is bounded, and one that would not fit the time left is reported
# as not run (the device tool stops a command at 10 minutes):
#   preflight  machine, GPU, glibc, where NCCL is, check_pack.sh against this image
#   tests      every packed test binary (gpu-tagged, and those with a GPU branch), XML reports
#   memcheck   compute-sanitizer --tool memcheck over one save and one load of CUDA tensors
#   disk       the disk's sequential read limit where checkpoints go: dd with O_DIRECT, one
#              request and four in flight, and buffered after dropping the page cache (fio
#              too where the image has it); the fastest is the limit
#   configs    per SIZExRANKS: a real coordinator and agents on loopback; every rank's pinned
#              cudaMemcpy device->host and host->device time of its bytes, all ranks at once;
#              K saves of CUDA tensors (staging pinned by cudaHostRegister); a load onto
#              another layout into device memory, every byte checked; for 1-rank
#              configurations, DCP async_save of the same bytes with this machine's PyTorch
#   report     after every section: results.md (the shape of docs/benchmarks' reference),
#              results.json, tests.txt, memcheck.txt, logs.tar.gz, and run.log, into --out:
#              6 files, no folders (the device tool returns at most 8)
#
# Options:
#   --pack=DIR        the pack (default: the folder above this script)
#   --out=DIR         results (default: $OUT, else ./gpu-results)
#   --data-dir=DIR    checkpoints: the disk measured (default: .device/gpu-data)
#   --configs=LIST    SIZExRANKS, comma-separated (default 1Gx1,8Gx1,2Gx4: 1 GiB and 8 GiB on
#                     one rank, then 4 trainer processes of 2 GiB sharing the GPU)
#   --steps=K         saves per configuration (default 6: the first, then 5 steady-state)
#   --dcp-steps=K     DCP async_save runs per 1-rank configuration (default 4)
#   --repeats=N       copy-limit repetitions (default 5)
#   --only=LIST       among tests,memcheck,disk,configs,dcp (default: all of them)
#   --budget=S        start nothing after S seconds; bound what runs by it (default 540)
#   --cpu-fallback    no GPU expected: the same binaries choose host memory at run time
#                     (cudaGetDeviceCount fails); GPU-only sections are reported as skipped.
#                     The pack test (tests/gpu/pack_test.sh) runs this way.
#   --no-drop-caches  leave the page cache alone (default: drop it before reads, as root)
#   --planning=LIST   also run the planning benchmark (issue 15) on this machine's cores, after
#                     the other sections: PPxTPxDP:SHARDS[:whole], comma-separated (e.g.
#                     16x8x128:300), each --planning-repeats times, tessera-plan-load's fake
#                     agents against a fresh coordinator as tests/bench/run.sh --only=plan runs
#                     them. Its raw files land in logs.tar.gz (raw/planning/); render them with
#                     tests/bench/report.py where Bazel is. Default: none.
#   --planning-repeats=N  runs of each planning configuration (default 3)
#   --plan            print what would run and exit
# Exit status: 0 if every section that ran succeeded (benchmark targets are reported, not
# enforced), 1 otherwise, 2 for bad options.
set -uo pipefail

PACK=$(dirname "$0")/..
OUT_DIR=${OUT:-$PWD/gpu-results}
DATA=""
CONFIGS=1Gx1,8Gx1,2Gx4
STEPS=6
DCP_STEPS=4
REPEATS=5
ONLY=tests,memcheck,disk,configs,dcp
BUDGET=540
CPU=0
DROP=1
PLAN=0
PLANNING=""
PLANNING_REPEATS=3
for arg in "$@"; do
  case "$arg" in
    --pack=*) PACK=${arg#*=} ;;
    --out=*) OUT_DIR=${arg#*=} ;;
    --data-dir=*) DATA=${arg#*=} ;;
    --configs=*) CONFIGS=${arg#*=} ;;
    --steps=*) STEPS=${arg#*=} ;;
    --dcp-steps=*) DCP_STEPS=${arg#*=} ;;
    --repeats=*) REPEATS=${arg#*=} ;;
    --only=*) ONLY=${arg#*=} ;;
    --budget=*) BUDGET=${arg#*=} ;;
    --cpu-fallback) CPU=1 ;;
    --no-drop-caches) DROP=0 ;;
    --planning=*) PLANNING=${arg#*=} ;;
    --planning-repeats=*) PLANNING_REPEATS=${arg#*=} ;;
    --plan) PLAN=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "on_device.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
wants() { [[ ",$ONLY," == *",$1,"* ]]; }
DATA=${DATA:-.device/gpu-data}
BENCH=tests/gpu/tessera-gpu-bench  # relative to $PACK/bin
MEMORY=cuda
[ "$CPU" = 1 ] && MEMORY=auto

# to_mib 512M|8G -> MiB
to_mib() {
  case "$1" in
    *G|*g) echo $(( ${1%?} * 1024 )) ;;
    *M|*m) echo "${1%?}" ;;
    *) echo "$1" ;;
  esac
}
# configs as "mib ranks" lines
parse_configs() {
  local c
  IFS=',' read -ra list <<<"$CONFIGS"
  for c in "${list[@]}"; do
    [[ "$c" =~ ^([0-9]+[MmGg]?)x([0-9]+)$ ]] || { echo "on_device.sh: bad config $c (SIZExRANKS)" >&2; return 1; }
    echo "$(to_mib "${BASH_REMATCH[1]}") ${BASH_REMATCH[2]}"
  done
}
CONFIG_LINES=$(parse_configs) || exit 2
load_world() { if [ "$1" -gt 1 ]; then echo $(( $1 / 2 )); else echo 2; fi; }

if [ "$PLAN" = 1 ]; then
  echo "on_device.sh plan (pack $PACK; results into ${OUT:-\$OUT}; checkpoints in $DATA):"
  echo "  preflight: nvidia-smi, glibc, NCCL located, scripts/check_pack.sh against the image"
  if wants tests; then
    echo "  tests (each: timeout, --gtest_output=xml, TESSERA_EXPECT_GPU=$((1 - CPU))):"
    if [ -d "$PACK/bin" ]; then
      find "$PACK/bin" -name '*_test' -type f | sed "s|^$PACK/bin/|    |" | sort
    else
      echo "    the *_test binaries in the pack (gpu-tagged and GPU-branch tests)"
    fi
  fi
  wants memcheck && echo "  memcheck: compute-sanitizer --tool memcheck --leak-check full over tessera-gpu-bench save (64 MiB, 2 steps) and load, CUDA tensors"
  wants disk && echo "  disk: dd O_DIRECT 4 MiB reads (1 and 4 in flight), buffered after drop_caches; fio if present"
  while read -r mib r; do
    [ -n "$mib" ] || continue
    echo "  config ${mib} MiB x $r rank(s): coordinator (--keep_last=2) + $r agent(s) tp=$r;" \
      "$r x tessera-gpu-bench save --memory=$MEMORY --steps=$STEPS --repeats=$REPEATS;" \
      "agents tp=$(load_world "$r"); $(load_world "$r") x tessera-gpu-bench load (every byte checked)"
    if wants dcp && [ "$r" = 1 ]; then
      echo "    + python3 scripts/dcp_peer.py: $DCP_STEPS x torch.distributed.checkpoint.async_save of $mib MiB of CUDA tensors"
    fi
  done <<<"$CONFIG_LINES"
  [ -z "$PLANNING" ] ||
    echo "  planning: $PLANNING, $PLANNING_REPEATS run(s) each: coordinator + tessera-plan-load (raw/planning/ in logs.tar.gz)"
  echo "  report: results.md results.json tests.txt memcheck.txt logs.tar.gz run.log"
  echo "  budget: start nothing after ${BUDGET} s"
  exit 0
fi

[ -f "$PACK/MANIFEST.txt" ] || { echo "on_device.sh: $PACK is not a pack (no MANIFEST.txt)" >&2; exit 2; }
PACK=$(cd "$PACK" && pwd)
mkdir -p "$OUT_DIR" "$DATA" || exit 1
OUT_DIR=$(cd "$OUT_DIR" && pwd)
DATA=$(cd "$DATA" && pwd)
exec > >(tee -a "$OUT_DIR/run.log") 2>&1
WORK=$(mktemp -d /tmp/tessera-gpu.XXXXXX)
RAW=$WORK/raw
LOGS=$WORK/logs
mkdir -p "$RAW/tests" "$LOGS"
START=$SECONDS
say() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - START))s] $*"; }
left() { echo $(( BUDGET - (SECONDS - START) )); }
# bound: seconds a process may run: what is left of the budget, at least 10 (timeout 0 = none).
bound() { local l; l=$(left); echo $(( l < 10 ? 10 : l )); }
failed=0
note_failure() { failed=1; echo "$1" >>"$RAW/failures.txt"; say "FAILED: $1"; }
skip() { echo "$1" >>"$RAW/skipped.txt"; say "not run: $1"; }

report() {
  python3 "$PACK/scripts/report.py" --work="$WORK" --out="$OUT_DIR" --configs="$CONFIGS" \
    --steps="$STEPS" >/dev/null 2>"$LOGS/report.err" || say "report.py failed: $(tail -n 3 "$LOGS/report.err")"
  # Logs and raw measurements, capped so the file comes back (16 MiB per file).
  tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" raw logs 2>/dev/null
  if [ "$(stat -c %s "$OUT_DIR/logs.tar.gz")" -gt $((15 << 20)) ]; then
    (cd "$WORK" && find logs -type f -size +1M -exec sh -c 'tail -c 262144 "$1" >"$1.tail" && mv "$1.tail" "$1"' _ {} \;)
    tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" raw logs 2>/dev/null
  fi
}
cleanup() {
  stop_all 2>/dev/null
  rm -f /dev/shm/tessera-gpu-bench-$$-* 2>/dev/null
  rm -rf "$DATA"/run-* "$DATA"/dcp-* "$DATA"/disk-read.dat "$DATA"/memcheck 2>/dev/null
  report
  rm -rf "$WORK"
}
trap cleanup EXIT

drop_caches() {
  sync
  if [ "$DROP" = 1 ] && [ -w /proc/sys/vm/drop_caches ] && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
    echo dropped
  else
    echo "not dropped"
  fi
}

# --- preflight
say "preflight: pack $PACK, results $OUT_DIR, checkpoints $DATA, memory=$MEMORY"
sed -n 's/^commit=/pack built from commit /p' "$PACK/MANIFEST.txt"
gpu_seen=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$RAW/gpu.txt" 2>&1; then
  gpu_seen=1
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max \
    --format=csv >"$RAW/gpu-query.csv" 2>&1
  cat "$RAW/gpu.txt"
else
  echo "no GPU: nvidia-smi absent or sees none" >"$RAW/gpu.txt"
fi
if [ "$CPU" = 0 ] && [ "$gpu_seen" = 0 ]; then
  note_failure "preflight: no GPU visible (nvidia-smi); use --cpu-fallback to run without one"
  exit 1
fi

# NCCL: not carried (208 MiB); the image's PyTorch brings it.
NCCL_DIR=""
for d in $(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF}' | xargs -r -n1 dirname) \
    /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
  [ -e "$d/libnccl.so.2" ] && { NCCL_DIR=$d; break; }
done
if [ -z "$NCCL_DIR" ]; then
  f=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2' -print -quit 2>/dev/null)
  [ -n "$f" ] && NCCL_DIR=$(dirname "$f")
fi
# The pack first, then NCCL, then whatever the image already sets (the driver's folder).
LIBPATH="$PACK/lib${NCCL_DIR:+:$NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
packed() { env LD_LIBRARY_PATH="$LIBPATH" "$@"; }
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)

{
  echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  echo "cores=$(nproc)"
  echo "mem_kib=$(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo)"
  echo "mem_available_kib=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)"
  echo "os=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "glibc=$(ldd --version 2>/dev/null | head -n 1)"
  echo "kernel=$(uname -srm)"
  echo "gpu=$(head -n 1 "$RAW/gpu.txt")"
  echo "gpu_query=$(tail -n +2 "$RAW/gpu-query.csv" 2>/dev/null | head -n 1)"
  echo "nvcc=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "sanitizer=${SANITIZER:-none}"
  echo "nccl_dir=${NCCL_DIR:-not found}"
  echo "python=$(python3 --version 2>&1)"
  echo "torch=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  src=$(df --output=source "$DATA" | tail -n 1)
  echo "disk_source=$src"
  echo "fs=$(df --output=fstype "$DATA" | tail -n 1)"
  echo "disk_avail_kib=$(df --output=avail -k "$DATA" | tail -n 1 | xargs)"
  echo "shm_avail_kib=$(df --output=avail -k /dev/shm | tail -n 1 | xargs)"
  echo "data_dir=$DATA"
  echo "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "pack_commit=$(sed -n 's/^commit=//p' "$PACK/MANIFEST.txt")"
  echo "pack_needs=glibc $(sed -n 's/^needs_glibc=//p' "$PACK/MANIFEST.txt"), GLIBCXX $(sed -n 's/^needs_glibcxx=//p' "$PACK/MANIFEST.txt")"
  echo "mode=$([ "$CPU" = 1 ] && echo "cpu-fallback" || echo gpu)"
  echo "configs=$CONFIGS steps=$STEPS dcp_steps=$DCP_STEPS repeats=$REPEATS only=$ONLY budget=$BUDGET"
} >"$RAW/machine.env"
cat "$RAW/machine.env"

# The size was checked where the pack was made; here it has arrived.
if ! bash "$PACK/scripts/check_pack.sh" --pack="$PACK" ${NCCL_DIR:+--extra-lib-dir="$NCCL_DIR"} \
    --no-size-check >"$RAW/check_pack.txt" 2>&1; then
  cat "$RAW/check_pack.txt"
  note_failure "preflight: the pack's libraries do not resolve on this image (raw/check_pack.txt)"
  exit 1
fi
cat "$RAW/check_pack.txt"
report

# --- tests
if wants tests; then
  say "tests"
  while read -r t; do
    name=$(basename "$t")
    tmp=$WORK/tmp-$name
    mkdir -p "$tmp"
    if [ "$(left)" -lt 30 ]; then skip "test $name: time budget"; continue; fi
    # -u: a test runner's own variables (when this runs under one) are not the binary's.
    timeout "$(( $(bound) < 300 ? $(bound) : 300 ))" env -u XML_OUTPUT_FILE \
      -u TEST_PREMATURE_EXIT_FILE -u TEST_SHARD_STATUS_FILE -u TEST_TOTAL_SHARDS \
      -u TEST_SHARD_INDEX -u GTEST_OUTPUT -u GTEST_FILTER TEST_TMPDIR="$tmp" \
      TESSERA_EXPECT_GPU="$gpu_seen" NCCL_DEBUG=WARN LD_LIBRARY_PATH="$LIBPATH" \
      "$t" --gtest_output="xml:$RAW/tests/$name.xml" >"$LOGS/$name.log" 2>&1
    rc=$?
    echo "$rc" >"$RAW/tests/$name.rc"
    say "  $name: exit $rc, $(grep -cE '^\[       OK \]' "$LOGS/$name.log") passed, $(grep -cE '^\[  SKIPPED \]' "$LOGS/$name.log") skipped lines, $(grep -cE '^\[  FAILED  \]' "$LOGS/$name.log") failed lines"
    [ "$rc" = 0 ] || note_failure "test $name exited $rc (logs/$name.log)"
  done < <(find "$PACK/bin" -name '*_test' -type f | sort)
  report
fi

# --- the cluster (deploy/lib, from the pack), each process with the pack's libraries
BIN=$PACK/bin
source "$PACK/scripts/deploy/lib/procs.sh"
COORD_WRAP=(env LD_LIBRARY_PATH="$LIBPATH")
source "$PACK/scripts/deploy/lib/cluster.sh"
source "$PACK/scripts/plan_run.sh"
PLAN_WRAP=(env LD_LIBRARY_PATH="$LIBPATH")
place_rank() { PLACE_WRAP=(env LD_LIBRARY_PATH="$LIBPATH"); PLACE_ADDR=127.0.0.1; PLACE_NODE=""; }
LEASE_MS=${LEASE_MS:-5000}  # agents of a new layout register once the old leases lapse
RANK_PIDS=()

# run_ranks MODE WORLD PREFIX BARRIER [flags...]: one tessera-gpu-bench per rank, bounded by
# $RANK_LIMIT seconds; the first rank that fails stops the others (they would wait at the
# barrier for it). Returns non-zero if any rank failed.
RANK_LIMIT=60
run_ranks() {
  local mode=$1 world=$2 prefix=$3 barrier=$4 r p rc=0
  shift 4
  packed "$BIN/$BENCH" barrier --barrier="$barrier" --parties="$world" || return 1
  RANK_PIDS=()
  for r in $(seq 0 $((world - 1))); do
    timeout "$RANK_LIMIT" env LD_LIBRARY_PATH="$LIBPATH" "$BIN/$BENCH" "$mode" \
      --agent="$SOCK_DIR/$JOB-$r.sock" --rank="$r" --world="$world" --barrier="$barrier" \
      --memory="$MEMORY" --out="$prefix-$r.json" "$@" </dev/null >"$DIR/logs/$mode-$r.out" 2>&1 &
    RANK_PIDS+=($!)
  done
  local running=("${RANK_PIDS[@]}") done_pid
  while [ ${#running[@]} -gt 0 ]; do
    if ! wait -n -p done_pid "${running[@]}"; then
      rc=1
      for p in "${running[@]}"; do kill -TERM "$p" 2>/dev/null; done
    fi
    for i in "${!running[@]}"; do [ "${running[$i]}" = "$done_pid" ] && unset 'running[i]'; done
    running=("${running[@]}")
  done
  RANK_PIDS=()
  rm -f "/dev/shm${barrier}"
  return $rc
}

# --- memcheck
if wants memcheck; then
  if [ "$CPU" = 1 ] || [ "$gpu_seen" = 0 ]; then
    skip "memcheck: no GPU"
  elif [ -z "$SANITIZER" ]; then
    note_failure "memcheck: compute-sanitizer not found"
  elif [ "$(left)" -lt 90 ]; then
    skip "memcheck: time budget"
  else
    say "memcheck: compute-sanitizer over one save and one load (64 MiB of CUDA tensors)"
    DIR=$DATA/memcheck JOB=gpumc
    rm -rf "$DIR"; mkdir -p "$DIR/logs"
    COORD_PORT=""
    if start_coordinator && start_agents "$JOB" tp=1; then
      SAN=("$SANITIZER" --tool memcheck --leak-check full --error-exitcode 97)
      for mode in save load; do
        extra=(--steps=2 --repeats=1)
        [ "$mode" = load ] && extra=(--step=2)
        timeout "$(( $(bound) < 300 ? $(bound) : 300 ))" "${SAN[@]}" --log-file "$LOGS/memcheck-$mode.log" \
          env LD_LIBRARY_PATH="$LIBPATH" "$BIN/$BENCH" "$mode" --agent="$SOCK_DIR/$JOB-0.sock" \
          --rank=0 --world=1 --mib=64 --memory=cuda --out="$RAW/memcheck-$mode.json" \
          "${extra[@]}" >"$LOGS/memcheck-$mode.out" 2>&1
        rc=$?
        echo "$rc" >"$RAW/memcheck-$mode.rc"
        say "  $mode under memcheck: exit $rc; $(grep -h 'ERROR SUMMARY' "$LOGS/memcheck-$mode.log" 2>/dev/null | tail -n 1)"
        [ "$rc" = 0 ] || note_failure "memcheck $mode exited $rc (logs/memcheck-$mode.log)"
      done
    else
      note_failure "memcheck: the cluster did not start"
    fi
    stop_agents >/dev/null 2>&1; stop_coordinator >/dev/null 2>&1
    cp -r "$DIR/logs" "$LOGS/memcheck-cluster"
    rm -rf "$DIR"
  fi
  report
fi

# --- disk: sequential read limit where the checkpoints go
largest=0
while read -r mib r; do [ $((mib * r)) -gt "$largest" ] && largest=$((mib * r)); done <<<"$CONFIG_LINES"
if wants disk; then
  disk_mib=$(( largest < 64 ? 64 : (largest > 4096 ? 4096 : largest) ))
  if [ "$(left)" -lt 60 ]; then
    skip "disk: time budget"
  else
    say "disk: $disk_mib MiB file in $DATA"
    f=$DATA/disk-read.dat
    quarter=$(( disk_mib / 16 ))  # 4 MiB blocks per quarter
    dd if=/dev/urandom of="$f" bs=4M count=$((disk_mib / 4)) iflag=fullblock oflag=direct conv=fsync 2>"$LOGS/dd-write.log" ||
      dd if=/dev/urandom of="$f" bs=4M count=$((disk_mib / 4)) iflag=fullblock conv=fsync 2>>"$LOGS/dd-write.log"
    bytes=$(stat -c %s "$f")
    : >"$RAW/disk.txt"
    measure() {  # measure NAME CMD...: wall seconds of CMD -> raw/disk.txt
      local name=$1 t0 t1 cache
      shift
      cache=$(drop_caches)
      t0=$(date +%s.%N)
      "$@" || { echo "$name failed" >>"$RAW/disk.txt"; return; }
      t1=$(date +%s.%N)
      echo "$name $bytes $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }') cache=${cache// /_}" >>"$RAW/disk.txt"
    }
    direct1() { dd if="$f" of=/dev/null bs=4M iflag=direct 2>>"$LOGS/dd-read.log"; }
    direct4() {
      local q pids=() rc=0
      for q in 0 1 2 3; do
        dd if="$f" of=/dev/null bs=4M iflag=direct skip=$((q * quarter)) count="$quarter" 2>>"$LOGS/dd-read.log" &
        pids+=($!)
      done
      for q in "${pids[@]}"; do wait "$q" || rc=1; done
      return $rc
    }
    buffered() { dd if="$f" of=/dev/null bs=4M 2>>"$LOGS/dd-read.log"; }
    measure dd-direct-1 direct1
    measure dd-direct-4 direct4
    [ "$(drop_caches)" = dropped ] && measure dd-buffered buffered
    if command -v fio >/dev/null 2>&1; then
      for mode in "psync:--ioengine=psync" "libaio4:--ioengine=libaio --iodepth=4"; do
        drop_caches >/dev/null
        # shellcheck disable=SC2086
        fio --name=seqread --filename="$f" --bs=4M --direct=1 --numjobs=1 ${mode#*:} \
          --size="${disk_mib}M" --rw=read --output-format=json \
          --output="$RAW/fio-read-${mode%%:*}.json" >>"$LOGS/fio.log" 2>&1
      done
    fi
    rm -f "$f"
    cat "$RAW/disk.txt"
  fi
  report
fi

# --- configurations
if wants configs; then
  mem_kib=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)
  while read -r mib r; do
    [ -n "$mib" ] || continue
    tag="${mib}M-x$r"
    total=$((mib * r))
    # Rough: ~2 s per GiB per save (copy, write, commit), load and checks, DCP for one rank.
    need_s=$(( 30 + total * (STEPS * 2 + 6 + (r == 1 ? DCP_STEPS * 2 : 0)) / 1024 ))
    shm_kib=$(df --output=avail -k /dev/shm | tail -n 1 | xargs)
    disk_kib=$(df --output=avail -k "$DATA" | tail -n 1 | xargs)
    if [ "$(left)" -lt "$need_s" ]; then
      skip "$tag: time budget ($(left) s left, about $need_s s needed)"; continue
    fi
    if [ $((total * 2 * 1024 + (1 << 20))) -gt "$mem_kib" ]; then
      # Not a reason to skip: a VM's MemAvailable can start low and grow with use.
      say "  note: MemAvailable is $((mem_kib / 1024)) MiB; $tag may need $((total * 2 + 1024)) MiB"
    fi
    if [ $((total * 2 * 1024 + (512 << 10))) -gt "$shm_kib" ]; then
      # The agents' staging lives in /dev/shm; on a fresh VM its size is half the RAM seen at boot.
      want_mib=$(( (total + 1024) * 2 ))
      if mount -o remount,size="${want_mib}m" /dev/shm 2>/dev/null; then
        say "  /dev/shm had $((shm_kib / 1024)) MiB free; remounted with size=${want_mib}m"
      else
        skip "$tag: /dev/shm has $((shm_kib / 1024)) MiB free, staging needs $((total * 2 + 512)) MiB"; continue
      fi
    fi
    if [ $((total * 3 * 1024 + (1 << 20))) -gt "$disk_kib" ]; then
      skip "$tag: $DATA has $((disk_kib / 1024)) MiB free, needs $((total * 3 + 1024)) MiB"; continue
    fi
    # Each phase's ranks get three times the estimate, within the budget.
    RANK_LIMIT=$(( need_s * 3 < $(bound) ? need_s * 3 : $(bound) ))
    # Each agent's staging budget (default: half the RAM the agent sees at start, shared by the
    # node's agents) set to what the run needs: two sets of its rank's bytes, as the memory tier
    # alternates saves between them (a budget of one set makes each save drop the last commit's
    # copy and stage in its region), and room for the reservation's headers.
    AGENT_FLAGS=(--staging_budget_mb=$((mib * 2 + 1024)))
    say "== $tag: $mib MiB x $r rank(s), $STEPS saves, load on tp=$(load_world "$r")"
    DIR=$DATA/run-$tag JOB=gpu$r
    rm -rf "$DIR"; mkdir -p "$DIR/logs"
    COORD_PORT=""
    mport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if start_coordinator --keep_last=2 --metrics_listen="127.0.0.1:$mport" &&
        start_agents "$JOB" "tp=$r" "${AGENT_FLAGS[@]}"; then
      if run_ranks save "$r" "$RAW/save-$tag" "/tessera-gpu-bench-$$-$tag-save" --mib="$mib" \
          --steps="$STEPS" --repeats="$REPEATS"; then
        say "  saves done"
      else
        note_failure "$tag: a save rank failed (logs/$tag/save-*.out)"
      fi
      python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(
        "http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode())' "$mport" \
        >"$RAW/metrics-$tag.txt" 2>/dev/null || say "  no metrics from the coordinator"
      du -sb "$DIR/ckpt" 2>/dev/null | cut -f1 >"$RAW/ckpt-bytes-$tag.txt"
      stop_agents >/dev/null 2>&1
      mkdir -p "$DIR/logs/save-agents" && mv "$DIR"/logs/agent-*.log "$DIR/logs/save-agents/"
      lw=$(load_world "$r")
      if start_agents "$JOB" "tp=$lw" "${AGENT_FLAGS[@]}"; then
        echo "$(drop_caches)" >"$RAW/load-cache-$tag.txt"
        if run_ranks load "$lw" "$RAW/load-$tag" "/tessera-gpu-bench-$$-$tag-load" --mib="$mib" \
            --saved_world="$r" --step="$STEPS"; then
          say "  load onto tp=$lw done: every byte matched"
        else
          note_failure "$tag: a load rank failed or read wrong bytes (logs/$tag/load-*.out)"
        fi
      else
        note_failure "$tag: the load agents did not register"
      fi
    else
      note_failure "$tag: the cluster did not start"
    fi
    stop_agents >/dev/null 2>&1; stop_coordinator >/dev/null 2>&1
    mkdir -p "$LOGS/$tag"; cp -r "$DIR/logs/." "$LOGS/$tag/"
    rm -rf "$DIR"
    if wants dcp && [ "$r" = 1 ]; then
      if [ "$(left)" -lt $((20 + mib * DCP_STEPS * 3 / 1024)) ]; then
        skip "$tag DCP: time budget"
      else
        say "  DCP async_save, $DCP_STEPS runs, this machine's PyTorch"
        timeout "$(bound)" python3 "$PACK/scripts/dcp_peer.py" --mib="$mib" --steps="$DCP_STEPS" \
          --dir="$DATA/dcp-$tag" --device="$([ "$MEMORY" = cuda ] && echo cuda || echo cpu)" \
          --out="$RAW/dcp-$tag.json" >"$LOGS/$tag/dcp.out" 2>&1 ||
          say "  DCP did not complete (logs/$tag/dcp.out): reported, not a failure of Tessera"
        rm -rf "$DATA/dcp-$tag"
      fi
    fi
    report
  done <<<"$CONFIG_LINES"
fi

# --- planning (issue 15): fake agents against a real coordinator, as tests/bench/run.sh's
# figure 5 runs them; rendered where Bazel is (tests/bench/report.py), not in results.md.
if [ -n "$PLANNING" ]; then
  mkdir -p "$RAW/planning/raw" "$RAW/planning/logs"
  # The pack's commit, and the checkpoint directory relative to the tree: the page is committed.
  { grep -v '^data_dir=' "$RAW/machine.env"; echo "data_dir=${DATA#"$PWD"/}"
    echo "commit=$(sed -n 's/^commit=//p' "$PACK/MANIFEST.txt")"
    echo "args=--only=plan --plan=$PLANNING --plan-repeats=$PLANNING_REPEATS (tests/gpu/on_device.sh)"; } \
    >"$RAW/planning/raw/machine.env"
  : >"$RAW/planning/raw/configs.txt"
  IFS=',' read -ra plan_configs <<<"$PLANNING"
  for config in "${plan_configs[@]}"; do
    IFS=':' read -r mesh shards protocol <<<"$config"
    fingerprints=true
    [ "$protocol" = whole ] && fingerprints=false
    IFS='x' read -r ppd tpd dpd <<<"$mesh"
    for i in $(seq 1 "$PLANNING_REPEATS"); do
      tag="$mesh-$shards${protocol:+-$protocol}-$i"
      if [ "$(left)" -lt 60 ]; then skip "planning $tag: time budget ($(left) s left)"; continue; fi
      say "== planning $tag: pp=$ppd x tp=$tpd x dp=$dpd ranks x $shards shards"
      DIR=$DATA/planning
      plan_run "$tag" "$ppd" "$tpd" "$dpd" "$shards" "$fingerprints" "$(bound)" "$RAW/planning/raw" \
        "$RAW/planning/logs" || note_failure "planning $tag (raw/planning/logs/plan-load-$tag.log)"
      rm -rf "$DIR"
    done
  done
fi

report
cat "$OUT_DIR/results.md"
say "done in $((SECONDS - START)) s; results in $OUT_DIR"
exit $failed
