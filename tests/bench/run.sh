#!/usr/bin/env bash
# Tessera benchmarks: every figure as a ratio against a baseline measured in the same run, on
# the same machine and the same disk (issues 7 and 14; targets in DESIGN.md "Performance
# targets"). Baselines are the physical limit: memcpy with the client's own copy threads (and
# with every core, reported beside it), and the fastest point of a fio sweep.
# Not a pass/fail test: it always exits 0 when it could measure, and reports whether each
# target was met. Run it on a quiet machine.
#
#   ./tests/bench/run.sh                          all figures, default sizes
#   ./tests/bench/run.sh --sizes=64M --ranks=1,2 --llama-size=256M --fio-size=256M \
#       --plan=2x2x2:12 --plan-repeats=1          (quick)
#   ./tests/bench/run.sh --reference=<machine>    also write docs/benchmarks/reference-<machine>.{md,png}
#   ./tests/bench/run.sh --only=s3 --s3-sizes=256M --ranks=1,4 --reference=<machine>
#                                                 the S3 figure alone: docs/benchmarks/s3-<machine>.*
#
# Every Tessera figure is the median of its runs with the p90 beside it: the stall and persist
# figures over the steady-state saves (steps >= 2), loads over --load-runs runs, torch.save over
# --torch-runs runs. Figures (results.md explains each row):
#   fio        the disk's limit: a sweep of bs {1M,4M,8M} x iodepth {1,4,16} x numjobs {1, each
#              rank count of the run}, libaio, O_DIRECT where the file system takes it; writes
#              end with an fsync, reads follow dropping the page cache (rows that read are not
#              judged if it could not be dropped). The fastest point is the baseline of the
#              persist and load rows; the report names it.
#   1 stall    save() blocked time / memcpy of the same bytes with the client's copy threads
#              (memcpy with every core beside it)
#   1f first   the first save's stall / the steady stall (target <= 3x)
#   2 persist  bytes / (first save() call -> last rank sees COMMITTED) vs the fio write max
#   2b phase   bytes / (the first rank's write began -> COMMITTED) per save, same baseline
#   3 peer     torch.save per rank + fsync vs Tessera: blocked time and time to durable
#   3c dcp     PyTorch DCP on the same state and ranks (dcp_peer.py): save, async_save, and
#              async_save with its pinned staging options, vs Tessera: stall and time to durable
#   4 load     bytes / load time onto another TP degree vs the fio read max, caches dropped
#   4b dcp     dcp.load of DCP's checkpoint onto the same other world size, caches dropped
#   4m memory  restore from memory: right after the saves, the same layout loads the last step
#              from its agents' memory tier, vs the memcpy of the same bytes (taken by the
#              loading ranks right before), and vs one pass of copy + XXH3 of them on the same
#              threads (what a restore that checks every byte cannot beat); with 2+ ranks,
#              the odd ranks' "node" is then lost and they restore on a new one from their
#              buddies' copies, vs loopback TCP bandwidth (tessera-link-bw): judged with those
#              ranks restoring alone, reported with every rank restoring at once (across
#              hosts whose link is the limit: tests/bench/buddy_hosts.sh, root)
#   5 plan     fake agents (in worker processes) through a real coordinator over gRPC: first
#              and cached plan time, coordinator peak RSS (VmHWM), manifest size, load and
#              write time; 1,024 x 1,000 and 16,384 x 300 judged, and a sweep of rank counts at
#              300 shards
#   6 gpu      only where nvidia-smi sees a GPU (else a "skipped: no GPU" row)
#   7 llama    the quickstart's llama-like model (examples/llama_trainer_main.cc, the C++
#              client) with the distributed optimizer (DP slices, replicated params hashed):
#              stall vs memcpy of each rank's bytes, first-save stall, persist and persist
#              phases vs the fio write max, and a load onto another TP degree vs the fio read
#              max, per --llama-layouts
#   8 s3       checkpoints in an S3-compatible object store (a SeaweedFS on loopback, the tests'
#              tessera-local-s3): the raw limit is the fastest point of a sweep of part size
#              x parts in flight for R multipart PUTs at once and piece size x reads in flight
#              for ranged GETs of them (tessera-s3-raw: storage/s3's client alone); Tessera's
#              save -> COMMITTED (steps >= 2) vs the PUT limit and a load onto another TP
#              degree vs the GET limit (target >= 0.90 each); the same save at other part
#              sizes x parts in flight (--s3-settings); PyTorch DCP through s3torchconnector
#              side by side (dcp.save, dcp.load onto the same other world size). Where the
#              server shares the machine's cores with the client, the report says the limit
#              is this machine's, not the store's
#
# Options (environment variable in brackets):
#   --sizes=256M,1G,4G     MiB per rank, suffix M or G          [TESSERA_BENCH_SIZES]
#   --ranks=1,4            rank counts                          [TESSERA_BENCH_RANKS]
#   --steps=6              saves per configuration (step 1 plans from scratch and is judged on
#                          its own; the later, steady-state steps give the medians: keep
#                          >= 6 for 5 samples)                  [TESSERA_BENCH_STEPS]
#   --load-runs=5          loads per configuration, the page cache dropped before each
#                                                               [TESSERA_BENCH_LOAD_RUNS]
#   --memory-runs=3        restores from memory (and from buddies) per configuration; each
#                          row is the run of median ratio      [TESSERA_BENCH_MEMORY_RUNS]
#                          (TESSERA_BENCH_PREFETCH=0: the restarted trainers' clients do not
#                          map the resident copy at connect, for a comparison)
#   --torch-runs=3         torch.save runs per configuration    [TESSERA_BENCH_TORCH_RUNS]
#   --llama-size=1G        figure 7: the model with its AdamW state, in all (the quickstart's
#                          TESSERA_DEMO_MB)                     [TESSERA_BENCH_LLAMA_SIZE]
#   --llama-layouts=1x1x1,1x2x2  figure 7's saving layouts PPxTPxDP (1 and 4 ranks; 2x2x2 is
#                          the quickstart's 8); each loads onto half its TP degree (tp=1: 2)
#                                                               [TESSERA_BENCH_LLAMA_LAYOUTS]
#   --plan=4x8x32:1000,... planning configurations PPxTPxDP[:SHARDS[:whole]]
#                          [TESSERA_BENCH_PLAN]; ":whole": agents re-send whole plans (no
#                          fingerprints), the baseline of the cached figure (default: 1,024 x
#                          1,000 and 16,384 x 300 both ways, and 128 ... 8,192 x 300)
#   --plan-shards=1000     shards per rank where a configuration names none
#                                                                [TESSERA_BENCH_PLAN_SHARDS]
#   --plan-repeats=3       runs of each planning configuration   [TESSERA_BENCH_PLAN_REPEATS]
#   --fio-sweep=quick      quick: each sweep point moves 1 GiB (a few minutes in all on a
#                          300 MiB/s disk); full: the largest configuration's total bytes, at
#                          least 1 GiB, at most 8 GiB          [TESSERA_BENCH_FIO_SWEEP]
#   --fio-size=4G          bytes each sweep point moves (overrides --fio-sweep; split across
#                          its jobs)                            [TESSERA_BENCH_FIO_SIZE]
#   --only=stall,plan,...  run only these figures (stall covers 1-3, dcp 3c and 4b, load is
#                          4, memory 4m, plan 5, gpu 6, llama 7, s3 8; the fio sweep runs with
#                          stall, load or llama)
#   --s3-sizes=256M,1G     figure 8: MiB per rank (at each of --ranks) [TESSERA_BENCH_S3_SIZES]
#   --s3-parts=8,16,32,64 --s3-flights=1,2,4,8  figure 8's raw sweep: part (and GET piece)
#                          MiB x requests of each object in flight
#                          [TESSERA_BENCH_S3_PARTS, TESSERA_BENCH_S3_FLIGHTS]
#   --s3-settings=8x4,32x4,64x4,16x1,16x2,16x8  figure 8: Tessera's save again at these
#                          part MiB x parts in flight (agent flags; the judged rows use the
#                          agents' defaults; "" for none)       [TESSERA_BENCH_S3_SETTINGS]
#   --s3-sweep-steps=3     saves per setting of --s3-settings   [TESSERA_BENCH_S3_SWEEP_STEPS]
#   --s3-dcp-steps=3       dcp.save runs through s3torchconnector [TESSERA_BENCH_S3_DCP_STEPS]
#   --data-dir=DIR         where checkpoints and the fio files go (the disk measured; default
#                          <results>/data, removed at the end)  [TESSERA_BENCH_DATA_DIR]
#   --out=DIR              results directory (default tests/bench/results/<timestamp>; also
#                          linked as tests/bench/results/latest)
#   --reference=NAME       also copy results.md / chart.png to docs/benchmarks/reference-NAME.*
#                          (s3-NAME.* when --only=s3)
#   --no-build             use binaries already built (with --bin=DIR: a bazel-bin directory)
#   --bazel="bazel --output_base=..."  the Bazel command line to build and locate binaries
#                                                               [TESSERA_BENCH_BAZEL]
#   TESSERA_BENCH_COORDINATOR_FLAGS: more tessera-coordinator flags for figures 1-4 (e.g.
#   --copy_when_pinned=false, to compare one setting against another in the same hour);
#   TESSERA_BENCH_AGENT_FLAGS: the same for every tessera-agent (e.g. --memory_tier=false).
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
STEPS=${TESSERA_BENCH_STEPS:-6}
LOAD_RUNS=${TESSERA_BENCH_LOAD_RUNS:-5}
MEMORY_RUNS=${TESSERA_BENCH_MEMORY_RUNS:-3}
TORCH_RUNS=${TESSERA_BENCH_TORCH_RUNS:-3}
LLAMA_SIZE=${TESSERA_BENCH_LLAMA_SIZE:-1G}
LLAMA_LAYOUTS=${TESSERA_BENCH_LLAMA_LAYOUTS:-1x1x1,1x2x2}
FIO_SWEEP=${TESSERA_BENCH_FIO_SWEEP:-quick}
PLAN=${TESSERA_BENCH_PLAN:-4x8x32:1000,4x8x32:1000:whole,16x8x128:300,16x8x128:300:whole,2x8x8:300,4x8x16:300,4x8x32:300,8x8x64:300,8x8x128:300}
PLAN_REPEATS=${TESSERA_BENCH_PLAN_REPEATS:-3}
PLAN_SHARDS=${TESSERA_BENCH_PLAN_SHARDS:-1000}
FIO_SIZE=${TESSERA_BENCH_FIO_SIZE:-}
DATA_DIR=${TESSERA_BENCH_DATA_DIR:-}
BAZEL=${TESSERA_BENCH_BAZEL:-bazel}
S3_SIZES=${TESSERA_BENCH_S3_SIZES:-256M,1G}
S3_PARTS=${TESSERA_BENCH_S3_PARTS:-8,16,32,64}
S3_FLIGHTS=${TESSERA_BENCH_S3_FLIGHTS:-1,2,4,8}
S3_SETTINGS=${TESSERA_BENCH_S3_SETTINGS-8x4,32x4,64x4,16x1,16x2,16x8}
S3_SWEEP_STEPS=${TESSERA_BENCH_S3_SWEEP_STEPS:-3}
S3_DCP_STEPS=${TESSERA_BENCH_S3_DCP_STEPS:-3}
ONLY=stall,dcp,load,memory,llama,s3,plan,gpu
OUT=""
REFERENCE=""
BUILD=1
BIN=""
for arg in "$@"; do
  case "$arg" in
    --sizes=*) SIZES=${arg#*=} ;;
    --ranks=*) RANKS=${arg#*=} ;;
    --steps=*) STEPS=${arg#*=} ;;
    --load-runs=*) LOAD_RUNS=${arg#*=} ;;
    --memory-runs=*) MEMORY_RUNS=${arg#*=} ;;
    --torch-runs=*) TORCH_RUNS=${arg#*=} ;;
    --llama-size=*) LLAMA_SIZE=${arg#*=} ;;
    --llama-layouts=*) LLAMA_LAYOUTS=${arg#*=} ;;
    --fio-sweep=*) FIO_SWEEP=${arg#*=} ;;
    --plan=*) PLAN=${arg#*=} ;;
    --plan-shards=*) PLAN_SHARDS=${arg#*=} ;;
    --plan-repeats=*) PLAN_REPEATS=${arg#*=} ;;
    --fio-size=*) FIO_SIZE=${arg#*=} ;;
    --only=*) ONLY=${arg#*=} ;;
    --s3-sizes=*) S3_SIZES=${arg#*=} ;;
    --s3-parts=*) S3_PARTS=${arg#*=} ;;
    --s3-flights=*) S3_FLIGHTS=${arg#*=} ;;
    --s3-settings=*) S3_SETTINGS=${arg#*=} ;;
    --s3-sweep-steps=*) S3_SWEEP_STEPS=${arg#*=} ;;
    --s3-dcp-steps=*) S3_DCP_STEPS=${arg#*=} ;;
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
S3_PARTS=${S3_PARTS//,/ }
S3_FLIGHTS=${S3_FLIGHTS//,/ }
case "$FIO_SWEEP" in quick|full) ;; *) echo "run.sh: --fio-sweep is quick or full, not $FIO_SWEEP" >&2; exit 2 ;; esac
[ "$STEPS" -ge 2 ] || { echo "run.sh: --steps must be at least 2 (step 1 is the first save)" >&2; exit 2; }
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
    //client/cli:tessera //examples:tessera-llama-trainer //tests/bench:tessera-plan-load \
    //tests/bench:tessera-link-bw $(wants s3 && echo //storage/s3/testing:tessera-local-s3 \
    //tests/bench:tessera-s3-raw) >"$OUT/logs/build.log" 2>&1 \
    || { tail -n 30 "$OUT/logs/build.log" >&2; exit 1; }
fi
BIN=${BIN:-$($BAZEL info bazel-bin 2>/dev/null)}
NEEDED="server/tessera-coordinator agent/tessera-agent client/python/site/tessera/_tessera.so
  client/cli/tessera"
wants memory && NEEDED="$NEEDED tests/bench/tessera-link-bw"  # the buddy restore's baseline
wants s3 && NEEDED="$NEEDED storage/s3/testing/tessera-local-s3 tests/bench/tessera-s3-raw"
for b in $NEEDED; do
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
  # Staging's page size: the huge= option of the /dev/shm mount in effect (the last listed),
  # unless shmem_enabled says deny or force (agent/shm_huge_pages.h).
  shm_huge=$(awk '$2 == "/dev/shm" { h = "never"; n = split($4, o, ",")
    for (i = 1; i <= n; i++) if (o[i] ~ /^huge=/) h = substr(o[i], 6) } END { print h }' /proc/mounts)
  shmem=$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null)
  echo "shm_huge=${shm_huge:-none} (shmem_enabled: ${shmem:-?})"
  echo "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo "+changes")"
  echo "torch=$($VENV_PYTHON -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  echo "fio=$(fio --version 2>/dev/null)"
  echo "args=$*"
} >"$OUT/raw/machine.env"

# device_read_bytes: bytes the bench dir's block device has read since boot (its stat file's
# sectors read x 512), or nothing where there is none to read (a network file system). Load
# rows give what the disk served during the loads, where the agents' counts say what they
# read from the files, some of it from the page cache: bench_rank.py reads the counter
# around its own load; the llama trainer's runs are counted from start to end (its binary is
# small beside the checkpoint).
DEV_STAT=/sys/class/block/$(basename "$(readlink -f "$(df --output=source "$DATA_DIR" | tail -n 1)" 2>/dev/null)")/stat
export TESSERA_BENCH_DEV_STAT=$DEV_STAT  # bench_rank.py reads it around each load itself
device_read_bytes() {
  [ -r "$DEV_STAT" ] && awk '{ printf "%.0f\n", $3 * 512 }' "$DEV_STAT"
}

# drop_caches: drops the page cache if we may; echoes "dropped", or "not dropped (why)". The
# report judges no row that read from disk after a "not dropped".
drop_caches() {
  sync
  if [ ! -w /proc/sys/vm/drop_caches ]; then
    echo "not dropped (/proc/sys/vm/drop_caches is not writable: not root?)"
  elif echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then
    echo dropped
  else
    echo "not dropped (writing 3 to /proc/sys/vm/drop_caches failed)"
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
    # Per rank at the peak: its tensors + the memcpy baseline buffer + its agent's staging (two
    # sets with the memory tier) + the buddy copy it holds for another rank; the load needs
    # less per loader; plus 1 GiB for the processes themselves.
    need=$(( 5 * mib * r + 1024 ))
    if [ "$need" -le "$mem_avail_mib" ]; then
      echo "$mib $r run $need" >>"$OUT/raw/configs.txt"
      [ $((mib * r)) -gt "$largest_total" ] && largest_total=$((mib * r))
    else
      echo "$mib $r skip $need" >>"$OUT/raw/configs.txt"
      say "not run: $mib MiB x $r ranks needs $need MiB of memory, $mem_avail_mib MiB available"
    fi
  done
done
# Figure 7's layouts: PPxTPxDP, the world size, and whether they fit. The trainers hold the
# model, the agents their staging and the memcpy baseline a copy: 3 x the ranks' bytes, which
# replicated parameters (over dp, a third of the state) make up to 2 x the model's size.
llama_mib=$(to_mib "$LLAMA_SIZE")
: >"$OUT/raw/llama-configs.txt"
if wants llama; then
  IFS=',' read -ra llama_list <<<"$LLAMA_LAYOUTS"
  for mesh in "${llama_list[@]}"; do
    IFS='x' read -r ppd tpd dpd <<<"$mesh"
    world=$((ppd * tpd * dpd))
    need=$(( 6 * llama_mib + 1024 ))
    if [ "$need" -le "$mem_avail_mib" ]; then
      echo "$mesh $world run $need $llama_mib" >>"$OUT/raw/llama-configs.txt"
      [ "$llama_mib" -gt "$largest_total" ] && largest_total=$llama_mib
    else
      echo "$mesh $world skip $need $llama_mib" >>"$OUT/raw/llama-configs.txt"
      say "not run: llama $llama_mib MiB as $mesh needs $need MiB of memory, $mem_avail_mib MiB available"
    fi
  done
fi

# --- fio: the disk's limit in DATA_DIR, a sweep (issue 14)
# bs x iodepth x numjobs (1, and each rank count this run saves with: Tessera writes one file
# per rank, several requests in flight), libaio, O_DIRECT where the file system takes it. Each
# point writes FIO_MIB in all (FIO_MIB / numjobs per job, a file each) ending with an fsync,
# drops the page cache and reads the files back. The fastest point of each direction is the
# baseline (report.py names it): the disk's limit, not one chosen configuration of it.
FIO_BS=(1M 4M 8M)
FIO_IODEPTHS=(1 4 16)
if wants stall || wants load || wants llama; then
  fio_jobs=(1)
  wants stall || wants load && fio_jobs+=("${rank_list[@]}")
  while read -r _ world verdict _; do
    [ "$verdict" = run ] && fio_jobs+=("$world")
  done <"$OUT/raw/llama-configs.txt"
  mapfile -t fio_jobs < <(printf '%s\n' "${fio_jobs[@]}" | sort -nu)
  fio_how=$FIO_SWEEP
  if [ -n "$FIO_SIZE" ]; then
    fio_mib=$(to_mib "$FIO_SIZE")
    fio_how="--fio-size=$FIO_SIZE"
  elif [ "$FIO_SWEEP" = full ]; then
    fio_mib=$(( largest_total < 1024 ? 1024 : (largest_total > 8192 ? 8192 : largest_total) ))
  else
    fio_mib=1024
  fi
  mkdir -p "$OUT/raw/fio"
  : >"$OUT/logs/fio.log"
  # O_DIRECT where the file system takes it (tmpfs, for one, refuses it): else through the
  # page cache, which the fsync at the end of each write and the dropped caches before each
  # read keep out of the figures.
  fio_direct=1
  if ! fio --name=fio-probe --directory="$DATA_DIR" --size=8M --bs=4M --ioengine=libaio \
      --direct=1 --rw=write >>"$OUT/logs/fio.log" 2>&1; then
    fio_direct=0
    say "fio: O_DIRECT refused in $DATA_DIR; the sweep goes through the page cache"
  fi
  rm -f "$DATA_DIR"/fio-probe.*
  points=$(( ${#FIO_BS[@]} * ${#FIO_IODEPTHS[@]} * ${#fio_jobs[@]} ))
  say "fio sweep ($fio_how): $points points (bs ${FIO_BS[*]} x iodepth ${FIO_IODEPTHS[*]} x numjobs ${fio_jobs[*]}), each writing then reading $fio_mib MiB in $DATA_DIR"
  {
    echo "sweep=$fio_how"
    echo "mib=$fio_mib"
    echo "direct=$fio_direct"
    echo "options=--ioengine=libaio --direct=$fio_direct --group_reporting; write: --rw=write --end_fsync=1; read: --rw=read after dropping the page cache; each point moves $fio_mib MiB split across its jobs (a file each)"
  } >"$OUT/raw/fio/sweep.env"
  for bs in "${FIO_BS[@]}"; do
    for qd in "${FIO_IODEPTHS[@]}"; do
      for nj in "${fio_jobs[@]}"; do
        point="bs$bs-qd$qd-j$nj"
        per_job=$(( fio_mib / nj / 8 * 8 ))  # a multiple of every bs
        [ "$per_job" -ge 8 ] || per_job=8
        fio_point=(--name=fio-sweep --directory="$DATA_DIR" --bs="$bs" --iodepth="$qd"
                   --numjobs="$nj" --size="${per_job}M" --ioengine=libaio
                   --direct="$fio_direct" --group_reporting --output-format=json)
        fio "${fio_point[@]}" --rw=write --end_fsync=1 --output="$OUT/raw/fio/write-$point.json" \
          >>"$OUT/logs/fio.log" 2>&1 || say "fio write $point failed (see $OUT/logs/fio.log)"
        drop_caches >"$OUT/raw/fio/read-$point.cache"
        fio "${fio_point[@]}" --rw=read --output="$OUT/raw/fio/read-$point.json" \
          >>"$OUT/logs/fio.log" 2>&1 || say "fio read $point failed (see $OUT/logs/fio.log)"
        rm -f "$DATA_DIR"/fio-sweep.*
      done
    done
  done
fi

# --- Figures 1-4: one cluster per configuration
source deploy/lib/cluster.sh
source tests/bench/plan_run.sh
LEASE_MS=2000
RANK_PIDS=()
bench_stop_all() {
  local p
  for p in "${RANK_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  stop_all
}
trap bench_stop_all EXIT

# run_ranks MODE JOB WORLD OUTPREFIX [bench_rank.py args...]: one process per rank; waits.
# With RUN_RANKS set (rank numbers, separated by spaces or newlines), only those ranks run
# and meet. Rank r's output goes to $DIR/logs/<OUTPREFIX's name>-r.out.
run_ranks() {
  local mode=$1 job=$2 world=$3 prefix=$4 r rc=0 ranks meet=()
  shift 4
  ranks=${RUN_RANKS:-$(seq 0 $((world - 1)))}
  [ -z "${RUN_RANKS:-}" ] || meet=(--barrier-ranks="$(echo $RUN_RANKS | tr ' ' ,)")
  RANK_PIDS=()
  for r in $ranks; do
    timeout 3600 $PY tests/bench/bench_rank.py "$mode" --agent="$SOCK_DIR/$job-$r.sock" \
      --rank="$r" --world="$world" --out="$prefix-$r.json" "${meet[@]}" "$@" \
      </dev/null >"$DIR/logs/$(basename "$prefix")-$r.out" 2>&1 &
    RANK_PIDS+=($!)
  done
  for p in "${RANK_PIDS[@]}"; do wait "$p" || rc=1; done
  RANK_PIDS=()
  return $rc
}

# save_sessions JOB OUTDIR: the job's committed checkpoints (checkpoints.json: step, bytes,
# session) and each one's session with its phase timings (<session>.json), from the
# coordinator: the persist-phase rows and figure 7's save -> COMMITTED.
save_sessions() {
  local job=$1 out=$2 id
  local cli=("$BIN/client/cli/tessera" --coordinator="127.0.0.1:$COORD_PORT" --json)
  mkdir -p "$out"
  "${cli[@]}" checkpoints "$job" >"$out/checkpoints.json" || return 1
  for id in $(/usr/bin/python3 -c 'import json, sys
print(" ".join(c["session_id"] for c in json.load(open(sys.argv[1])).get("checkpoints", [])))' \
      "$out/checkpoints.json"); do
    "${cli[@]}" status "$job" --session="$id" >"$out/$id.json" || return 1
  done
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
    if ! start_coordinator ${TESSERA_BENCH_COORDINATOR_FLAGS:-}; then
      say "$tag: the coordinator did not start"; cp -r "$DIR/logs" "$OUT/logs/$tag"; continue
    fi
    # Figure 4m's buddy restore needs two nodes: even ranks on bench-n0, odd ones on bench-n1.
    place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=bench-n$(($1 % 2)); }
    if ! start_agents "$job" "tp=$r" ${TESSERA_BENCH_AGENT_FLAGS:-}; then
      say "$tag: agents did not register"; stop_all; cp -r "$DIR/logs" "$OUT/logs/$tag"; continue
    fi
    if ! run_ranks save "$job" "$r" "$OUT/raw/save-$tag" --mib="$mib" --steps="$STEPS" \
        --barrier="$DIR/barrier-save" --torch-dir="$DIR/torch" --torch-runs="$TORCH_RUNS"; then
      say "$tag: a save rank failed (logs in $OUT/logs/$tag)"
    fi
    save_sessions "$job" "$OUT/raw/sessions-$tag" || say "$tag: the sessions' phases were not read"
    if wants memory; then
      # The agents still hold the last step: the same layout loads it from memory, MEMORY_RUNS
      # times, each right after its own memcpy baseline.
      echo "$MEMORY_RUNS" >"$OUT/raw/memory-runs-$tag.txt"
      for i in $(seq 1 "$MEMORY_RUNS"); do
        run_ranks load "$job" "$r" "$OUT/raw/memload-$tag-run$i" --mib="$mib" --saved-world="$r" \
          --memcpy-baseline --barrier="$DIR/barrier-memload-$i" ||
          say "$tag: a memory load rank failed in run $i (logs in $OUT/logs/$tag)"
      done
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
          for i in $(seq 1 "$MEMORY_RUNS"); do
            # The link, then the same with its receivers checking what arrives (reported).
            "$BIN/tests/bench/tessera-link-bw" --streams=$((r / 2)) --mib="$mib" \
              >"$OUT/raw/link-$tag-run$i.json" 2>>"$OUT/logs/link.log" ||
              say "$tag: loopback bandwidth not measured in run $i"
            "$BIN/tests/bench/tessera-link-bw" --streams=$((r / 2)) --mib="$mib" --check \
              >"$OUT/raw/linkcheck-$tag-run$i.json" 2>>"$OUT/logs/link.log" ||
              say "$tag: loopback bandwidth with checking receivers not measured in run $i"
            # Judged: the new node's ranks restore alone, as the link's baseline runs alone
            # (on a cluster the surviving node's restores use that node's cores, not these).
            RUN_RANKS="$(seq 1 2 $((r - 1)))" run_ranks load "$job" "$r" \
              "$OUT/raw/buddyload-$tag-run$i" --mib="$mib" --saved-world="$r" \
              --barrier="$DIR/barrier-buddyload-$i" ||
              say "$tag: a buddy restore rank failed in run $i (logs in $OUT/logs/$tag)"
            # Reported: every rank restoring at once, as a restarted job does; here the two
            # "nodes" share the machine's cores.
            run_ranks load "$job" "$r" "$OUT/raw/buddyshared-$tag-run$i" --mib="$mib" \
              --saved-world="$r" --barrier="$DIR/barrier-buddyshared-$i" ||
              say "$tag: a shared buddy restore rank failed in run $i (logs in $OUT/logs/$tag)"
          done
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
        echo "$r $lr" >"$OUT/raw/load-layout-$tag.txt"
        for i in $(seq 1 "$LOAD_RUNS"); do
          drop_caches >"$OUT/raw/load-cache-$tag-run$i.txt"
          run_ranks load "$job" "$lr" "$OUT/raw/load-$tag-run$i" --mib="$mib" \
            --saved-world="$r" --barrier="$DIR/barrier-load-$i" \
            || say "$tag: a load rank failed in run $i (logs in $OUT/logs/$tag)"
        done
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

# --- Figure 7: the quickstart's llama-like model through the C++ client
# Per layout: STEPS saves with the distributed optimizer (the trainer prints each rank's stall
# and bytes), the sessions' phases from the coordinator, then (agents stopped, so nothing else
# runs) the memcpy baselines of each rank's bytes with every rank at once, then LOAD_RUNS loads
# onto half the TP degree (tp=1: 2) by fresh agents, which hold nothing in memory, with the page
# cache dropped before each. Trainer output: raw/llama-{save,load-runI}-<tag>-<rank>.out.
if wants llama; then
  steps_list=$(seq -s, 1 "$STEPS")
  while read -r mesh world verdict _ <&3; do
    [ "$verdict" = run ] || continue
    IFS='x' read -r ppd tpd dpd <<<"$mesh"
    layout="pp=$ppd,tp=$tpd,dp=$dpd"
    load_layout="pp=$ppd,tp=$(( tpd > 1 ? tpd / 2 : 2 )),dp=$dpd"
    tag="llama-${llama_mib}M-$mesh"
    DIR="$DATA_DIR/run-$tag"
    rm -rf "$DIR"
    mkdir -p "$DIR/logs"
    job="llama$world"
    mkdir -p "$DIR/barrier"
    # Ranks meet before each save (as bench_rank.py's do), so a stall excludes waiting for a
    # rank still filling its tensors; one node: no buddy copies compete with the saves.
    trainer=(--total_mb="$llama_mib" --optimizer=distributed --step_barrier="$DIR/barrier")
    place_rank() { PLACE_WRAP=(); PLACE_ADDR=127.0.0.1; PLACE_NODE=""; }
    say "== llama $llama_mib MiB (distributed optimizer) as $layout: $STEPS saves, memcpy, $LOAD_RUNS loads onto $load_layout"
    COORD_PORT=""
    if ! start_coordinator ${TESSERA_BENCH_COORDINATOR_FLAGS:-}; then
      say "$tag: the coordinator did not start"; cp -r "$DIR/logs" "$OUT/logs/$tag"; continue
    fi
    if start_agents "$job" "$layout" ${TESSERA_BENCH_AGENT_FLAGS:-}; then
      TRAINER_TIMEOUT=3600 run_trainers "$job" "$layout" --mode=save --steps="$steps_list" \
        "${trainer[@]}" || say "$tag: a trainer failed (logs in $OUT/logs/$tag)"
      for r in $(seq 0 $((world - 1))); do
        cp "$DIR/logs/trainer-$job-$r.out" "$OUT/raw/llama-save-$tag-$r.out" 2>/dev/null
      done
      save_sessions "$job" "$OUT/raw/sessions-$tag" || say "$tag: the sessions' phases were not read"
      stop_agents >/dev/null 2>&1
      # Each rank's bytes, as its trainer printed them ("trainer stall for X MiB").
      mapfile -t rank_bytes < <(for r in $(seq 0 $((world - 1))); do
        sed -nE 's/.* staged: .* trainer stall for ([0-9.]+) MiB.*/\1/p' \
          "$OUT/raw/llama-save-$tag-$r.out" 2>/dev/null | head -n 1 |
          awk '{ printf "%d\n", $1 * 1048576 }'
      done)
      if [ "${#rank_bytes[@]}" -eq "$world" ]; then
        RANK_PIDS=()
        for r in $(seq 0 $((world - 1))); do
          timeout 3600 $PY tests/bench/bench_rank.py memcpy --rank="$r" --world="$world" \
            --bytes="${rank_bytes[$r]}" --barrier="$DIR/barrier-memcpy" \
            --out="$OUT/raw/llama-memcpy-$tag-$r.json" </dev/null >"$DIR/logs/memcpy-$r.out" 2>&1 &
          RANK_PIDS+=($!)
        done
        for p in "${RANK_PIDS[@]}"; do wait "$p" || say "$tag: a memcpy rank failed (logs in $OUT/logs/$tag)"; done
        RANK_PIDS=()
      else
        say "$tag: not every trainer printed its bytes: no memcpy baseline"
      fi
      if start_agents "$job" "$load_layout"; then
        echo "$layout $load_layout" >"$OUT/raw/llama-load-layout-$tag.txt"
        for i in $(seq 1 "$LOAD_RUNS"); do
          drop_caches >"$OUT/raw/llama-load-cache-$tag-run$i.txt"
          device_read_bytes >"$OUT/raw/llama-load-disk-$tag-run$i.txt"
          TRAINER_TIMEOUT=3600 run_trainers "$job" "$load_layout" --mode=load --load_step=-1 \
            "${trainer[@]}" || say "$tag: a loading trainer failed in run $i (logs in $OUT/logs/$tag)"
          device_read_bytes >>"$OUT/raw/llama-load-disk-$tag-run$i.txt"
          for r in $(seq 0 $(( $(world_size "$load_layout") - 1 ))); do
            cp "$DIR/logs/trainer-$job-$r.out" "$OUT/raw/llama-load-run$i-$tag-$r.out" 2>/dev/null
          done
        done
        stop_agents >/dev/null 2>&1
      else
        say "$tag: the loading agents ($load_layout) did not register"
      fi
    else
      say "$tag: agents did not register"
    fi
    stop_agents >/dev/null 2>&1
    stop_coordinator >/dev/null 2>&1
    cp -r "$DIR/logs" "$OUT/logs/$tag"
    rm -rf "$DIR"
  done 3<"$OUT/raw/llama-configs.txt"
fi

# --- Figure 8: checkpoints in an S3-compatible object store (issue 48)
# One SeaweedFS (tessera-local-s3, the tests' server) on loopback for the whole figure, with
# volumes of 1 GiB; every byte a phase wrote is deleted and vacuumed before the next phase, so
# the server holds one phase's data at a time. Per configuration (MiB per rank x ranks):
#   raw put   tessera-s3-raw: R multipart uploads at once, part size S3_PARTS x parts in flight
#             S3_FLIGHTS (one sample per point); the fastest point is the save's baseline
#   raw get   R objects uploaded at Tessera's default part size, read whole with ranged GETs of
#             S3_PARTS x S3_FLIGHTS; the fastest point is the load's baseline
#   save      STEPS Tessera saves (tp=R, the agents' default part size and parts in flight)
#             into s3://BUCKET/<tag>/tessera; rank 0 records weed's, the agents' and the
#             machine's CPU ticks around each (TESSERA_BENCH_CPU_PIDS)
#   load      LOAD_RUNS loads of the last step onto another TP degree (R/2, or 2 for R=1) by
#             fresh agents (nothing in memory)
#   settings  S3_SETTINGS: the same save at other part sizes x parts in flight (agent flags
#             --s3_part_size_mb, --s3_parts_in_flight), S3_SWEEP_STEPS saves each
#   dcp       dcp_peer.py --s3: S3_DCP_STEPS dcp.save through s3torchconnector, then dcp.load
#             onto the load's world size (skipped, with the reason, if it cannot import)
# Raw files under raw/s3/: put-<tag>-p<S>-k<K>.json, get-..., save-<tag>-<rank>.json,
# load-<tag>-run<i>-<rank>.json, sessions-<tag>/, setting-<tag>-p<S>-k<K>-<rank>.json,
# dcp-save-<tag>-<rank>.json, dcp-load-<tag>-<rank>.json, configs.txt, s3.env.
if wants s3; then
  S3_DIR="$DATA_DIR/s3"
  S3_BUCKET=bench
  mkdir -p "$OUT/raw/s3" "$S3_DIR/logs"
  DIR=$S3_DIR
  : >"$OUT/raw/s3/configs.txt"
  IFS=',' read -ra s3_size_list <<<"$S3_SIZES"
  for s in "${s3_size_list[@]}"; do
    mib=$(to_mib "$s")
    for r in "${rank_list[@]}"; do
      # Per rank: its tensors, its agent's staging (twice with the memory tier) and a raw
      # upload's buffer; plus 2 GiB for SeaweedFS and the processes.
      need=$(( 4 * mib * r + 2048 ))
      verdict=run
      [ "$need" -le "$mem_avail_mib" ] || { verdict=skip; say "not run: S3 $mib MiB x $r ranks needs $need MiB of memory, $mem_avail_mib MiB available"; }
      echo "$mib $r $verdict $need" >>"$OUT/raw/s3/configs.txt"
    done
  done
  say "== S3: starting SeaweedFS (tessera-local-s3) in $S3_DIR"
  if TESSERA_WEED=${TESSERA_VENV:-$ROOT/.venv}/bin/weed start_local_s3 "$S3_BUCKET" \
      --volume_size_limit_mb=1024 --max_volumes=200; then
    {
      echo "weed=$(${TESSERA_VENV:-$ROOT/.venv}/bin/weed version 2>/dev/null | awk '{ print $3 }')"
      echo "s3torchconnector=$($VENV_PYTHON -c 'from importlib.metadata import version; print(version("s3torchconnector"))' 2>/dev/null)"
      # The agents' S3 defaults, from their --help (S3StorageOptions' defaults).
      echo "defaults=$("$BIN/agent/tessera-agent" --help 2>&1 | tr '\n' ' ' |
        grep -o -- '--s3_[a-z_]* ([^;]*; *default: [0-9]*' |
        sed 's/^--s3_\([a-z_]*\) .*default: \([0-9]*\)$/\1=\2/' | tr '\n' ' ')"
      echo "parts=$S3_PARTS"
      echo "flights=$S3_FLIGHTS"
    } >"$OUT/raw/s3/s3.env"
    raw_s3=("$BIN/tests/bench/tessera-s3-raw" --bucket="$S3_BUCKET"
            --watch_pids="$TESSERA_LOCAL_S3_WEED_PID")
    # s3_clear PREFIX: deletes every object under PREFIX and vacuums the server's volumes.
    s3_clear() {
      "${raw_s3[@]}" --op=clean --prefix="$1" 2>>"$OUT/logs/s3-raw.log" ||
        say "S3: clearing $1 failed (see logs/s3-raw.log)"
      curl -sf "$TESSERA_LOCAL_S3_MASTER/vol/vacuum?garbageThreshold=0.01" >/dev/null ||
        say "S3: the vacuum failed"
    }
    # One untimed upload first: the server's first volumes are made outside the figures.
    "${raw_s3[@]}" --op=put --prefix=warmup --mib=64 >/dev/null 2>>"$OUT/logs/s3-raw.log"
    s3_clear warmup
    while read -r mib r verdict _ <&3; do
      [ "$verdict" = run ] || continue
      tag="${mib}M-x$r"
      lr=$(( r > 1 ? r / 2 : 2 ))
      say "== S3 $mib MiB per rank x $r ranks: raw sweep (part size {$S3_PARTS} x in flight {$S3_FLIGHTS})"
      for part in $S3_PARTS; do
        for k in $S3_FLIGHTS; do
          "${raw_s3[@]}" --op=put --prefix="raw-$tag" --ranks="$r" --mib="$mib" --part_mb="$part" \
            --in_flight="$k" >"$OUT/raw/s3/put-$tag-p$part-k$k.json" 2>>"$OUT/logs/s3-raw.log" ||
            say "S3 raw put $tag part $part x $k failed (see logs/s3-raw.log)"
          s3_clear "raw-$tag"
        done
      done
      read_part=$(sed -n 's/.*part_size_mb=\([0-9]*\).*/\1/p' "$OUT/raw/s3/s3.env")
      if "${raw_s3[@]}" --op=put --prefix="raw-$tag" --ranks="$r" --mib="$mib" \
          --part_mb="${read_part:-16}" --keep >/dev/null 2>>"$OUT/logs/s3-raw.log"; then
        for part in $S3_PARTS; do
          for k in $S3_FLIGHTS; do
            "${raw_s3[@]}" --op=get --prefix="raw-$tag" --ranks="$r" --mib="$mib" --part_mb="$part" \
              --in_flight="$k" >"$OUT/raw/s3/get-$tag-p$part-k$k.json" 2>>"$OUT/logs/s3-raw.log" ||
              say "S3 raw get $tag piece $part x $k failed (see logs/s3-raw.log)"
          done
        done
      else
        say "S3 raw: the objects to read were not uploaded (see logs/s3-raw.log)"
      fi
      s3_clear "raw-$tag"

      # Tessera at the agents' defaults: saves, then loads onto another TP degree.
      DIR="$S3_DIR/run-$tag"
      rm -rf "$DIR"
      mkdir -p "$DIR/logs"
      STORAGE_ROOT="s3://$S3_BUCKET/$tag/tessera"
      COORD_PORT=""
      job="s3x$r"
      say "S3 $tag: $STEPS Tessera saves (tp=$r), $LOAD_RUNS loads onto tp=$lr"
      if start_coordinator ${TESSERA_BENCH_COORDINATOR_FLAGS:-}; then
        if start_agents "$job" "tp=$r" ${TESSERA_BENCH_AGENT_FLAGS:-}; then
          TESSERA_BENCH_CPU_PIDS="weed=$TESSERA_LOCAL_S3_WEED_PID,agents=$(IFS=+; echo "${AGENT_PIDS[*]}")" \
            run_ranks save "$job" "$r" "$OUT/raw/s3/save-$tag" --mib="$mib" --steps="$STEPS" \
            --no-baselines --barrier="$DIR/barrier-save" ||
            say "S3 $tag: a save rank failed (logs in $OUT/logs/s3-$tag)"
          save_sessions "$job" "$OUT/raw/s3/sessions-$tag" ||
            say "S3 $tag: the sessions' phases were not read"
          stop_agents >/dev/null 2>&1
          if start_agents "$job" "tp=$lr" ${TESSERA_BENCH_AGENT_FLAGS:-}; then
            echo "$r $lr" >"$OUT/raw/s3/load-layout-$tag.txt"
            for i in $(seq 1 "$LOAD_RUNS"); do
              TESSERA_BENCH_CPU_PIDS="weed=$TESSERA_LOCAL_S3_WEED_PID,agents=$(IFS=+; echo "${AGENT_PIDS[*]}")" \
                run_ranks load "$job" "$lr" "$OUT/raw/s3/load-$tag-run$i" --mib="$mib" \
                --saved-world="$r" --barrier="$DIR/barrier-load-$i" ||
                say "S3 $tag: a load rank failed in run $i (logs in $OUT/logs/s3-$tag)"
            done
          else
            say "S3 $tag: the loading agents did not register"
          fi
          stop_agents >/dev/null 2>&1
        else
          say "S3 $tag: agents did not register"
        fi
        # Other part sizes x parts in flight, a job each.
        IFS=',' read -ra settings <<<"$S3_SETTINGS"
        for setting in "${settings[@]}"; do
          [ -n "$setting" ] || continue
          IFS='x' read -r part k <<<"$setting"
          sjob="s3x$r-p$part-k$k"
          say "S3 $tag: $S3_SWEEP_STEPS saves with --s3_part_size_mb=$part --s3_parts_in_flight=$k"
          if start_agents "$sjob" "tp=$r" --s3_part_size_mb="$part" --s3_parts_in_flight="$k" \
              ${TESSERA_BENCH_AGENT_FLAGS:-}; then
            TESSERA_BENCH_CPU_PIDS="weed=$TESSERA_LOCAL_S3_WEED_PID,agents=$(IFS=+; echo "${AGENT_PIDS[*]}")" \
              run_ranks save "$sjob" "$r" "$OUT/raw/s3/setting-$tag-p$part-k$k" --mib="$mib" \
              --steps="$S3_SWEEP_STEPS" --no-baselines --barrier="$DIR/barrier-$sjob" ||
              say "S3 $tag: a save rank failed at part $part x $k"
          else
            say "S3 $tag: agents with part $part x $k did not register"
          fi
          stop_agents >/dev/null 2>&1
          s3_clear "$tag/tessera/$sjob"
        done
      else
        say "S3 $tag: the coordinator did not start"
      fi
      stop_coordinator >/dev/null 2>&1
      s3_clear "$tag/tessera"

      # PyTorch DCP through s3torchconnector, on the same state and ranks.
      if ! err=$($VENV_PYTHON -c 'import s3torchconnector.dcp' 2>&1); then
        echo "skipped: s3torchconnector does not import in $VENV_PYTHON: $(echo "$err" | tail -n 1)" \
          >"$OUT/raw/s3/dcp-$tag.txt"
      else
        say "S3 $tag: PyTorch DCP + s3torchconnector: $S3_DCP_STEPS dcp.save, dcp.load onto $lr ranks"
        run_dcp save "$r" "$OUT/raw/s3/dcp-save-$tag" --mib="$mib" --steps="$S3_DCP_STEPS" \
          --s3="s3://$S3_BUCKET/$tag/dcp" ||
          say "S3 $tag: a DCP save rank failed (logs in $OUT/logs/s3-$tag)"
        run_dcp load "$lr" "$OUT/raw/s3/dcp-load-$tag" --mib="$mib" --saved-world="$r" \
          --steps="$S3_DCP_STEPS" --s3="s3://$S3_BUCKET/$tag/dcp" ||
          say "S3 $tag: a DCP load rank failed (logs in $OUT/logs/s3-$tag)"
        s3_clear "$tag/dcp"
      fi
      cp -r "$DIR/logs" "$OUT/logs/s3-$tag"
      rm -rf "$DIR"
      DIR=$S3_DIR
    done 3<"$OUT/raw/s3/configs.txt"
  else
    echo "skipped: SeaweedFS did not start (see logs/s3)" >"$OUT/raw/s3/failed.txt"
  fi
  [ -z "$LOCAL_S3_PID" ] || stop_process "$LOCAL_S3_PID" 10 >/dev/null 2>&1
  LOCAL_S3_PID=""
  STORAGE_ROOT=""
  cp -r "$S3_DIR/logs" "$OUT/logs/s3" 2>/dev/null
  rm -rf "$S3_DIR"
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
      plan_run "$tag" "$ppd" "$tpd" "$dpd" "$shards" "$fingerprints" 1800 "$OUT/raw" "$OUT/logs" ||
        say "planning $tag failed (above; logs in $OUT/logs/)"
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
  name=reference-$REFERENCE
  [ "$ONLY" = s3 ] && name=s3-$REFERENCE
  sed "s|chart.png|$name.png|; s|plan.png|$name-plan.png|" \
    "$OUT/results.md" >"docs/benchmarks/$name.md"
  [ -f "$OUT/chart.png" ] && cp "$OUT/chart.png" "docs/benchmarks/$name.png"
  [ -f "$OUT/plan.png" ] && cp "$OUT/plan.png" "docs/benchmarks/$name-plan.png"
  say "reference written: docs/benchmarks/$name.md"
fi
cat "$OUT/results.md"
