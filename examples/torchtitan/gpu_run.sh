#!/usr/bin/env bash
# A real torchtitan training run (its llama3 debug model) checkpointed through Tessera,
# killed and resumed, in one command on a GPU machine:
#
#   examples/torchtitan/gpu_run.sh --torchtitan-src=DIR [--bin=DIR] [--gpus=N] [--out=DIR]
#
#   --torchtitan-src  a torchtitan 0.3.0 source checkout (its tests/assets: the debug model's
#                     tokenizer and the c4_test data set, which the wheel does not hold)
#   --bin             where tessera-coordinator, tessera-agent and tessera are (default: on
#                     PATH, else .bazel/bin's server/, agent/, client/cli/)
#   --gpus            trainer ranks (default: every GPU)
#   --out             logs and checkpoints (default: a new temporary folder)
#
# Needs: CUDA GPUs, the tessera Python package, torchtitan 0.3.0 with all its dependencies,
# and a PyTorch that torchtitan 0.3.0's trainer runs on (torch 2.11 lacks
# torch.distributed.fsdp.DataParallelMeshDims, which it imports). Whatever is missing is said
# and the script exits 0 having run nothing (tests/skip.sh).
#
# What it checks: run 1 trains 15 steps with checkpoint.interval=5 and is SIGKILLed (the whole
# process group: launcher, torchrun, trainers, agents) once step 5 is committed; run 2, the
# same command, loads the newest committed step L (5, or 10 if run 1 got there first:
# "Tessera: loaded step L"), trains on from L+1 ("Training starts at step L+1"), and its last
# step, 15, is saved and exported to <dump>/checkpoint/step-15/model.safetensors. Exit 0 when
# all of it held.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/skip.sh
SRC="" BIN_DIR="" GPUS="" OUT=""
for arg in "$@"; do
  case "$arg" in
    --torchtitan-src=*) SRC=${arg#*=} ;;
    --bin=*) BIN_DIR=${arg#*=} ;;
    --gpus=*) GPUS=${arg#*=} ;;
    --out=*) OUT=${arg#*=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_run.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || skip "no CUDA GPU here"
why=$("$PYTHON" -c "import torchtitan.train, tessera.torchtitan" 2>&1 | tail -n 1) ||
  skip "torchtitan's trainer or tessera.torchtitan does not import here: $why"
[ -d "$SRC/tests/assets/tokenizer" ] ||
  skip "no torchtitan source checkout with tests/assets given (--torchtitan-src=DIR)"
find_bin() {  # find_bin NAME BAZEL_SUBDIR
  if [ -n "$BIN_DIR" ]; then echo "$BIN_DIR/$1"
  elif command -v "$1" >/dev/null; then command -v "$1"
  else echo ".bazel/bin/$2/$1"; fi
}
COORD=$(find_bin tessera-coordinator server) AGENT=$(find_bin tessera-agent agent)
export TESSERA_CLI=$(find_bin tessera client/cli)
for b in "$COORD" "$AGENT" "$TESSERA_CLI"; do [ -x "$b" ] || skip "no $b (build it or pass --bin)"; done
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT/logs"
export PYTHONPATH="$PWD/examples/torchtitan${PYTHONPATH:+:$PYTHONPATH}"

"$COORD" --listen=127.0.0.1:0 --db_path="$OUT/db" --storage_root="$OUT/ckpt" \
  2>"$OUT/logs/coordinator.log" &
coord_pid=$!
trap 'kill $coord_pid 2>/dev/null' EXIT
for _ in $(seq 100); do
  port=$(grep -o "(port [0-9]*)" "$OUT/logs/coordinator.log" | grep -o "[0-9]*") && break
  sleep 0.1
done
[ -n "${port:-}" ] || { echo "FAIL: the coordinator did not start: $(tail -n 5 "$OUT/logs/coordinator.log")"; exit 1; }

# run N: the README's command line, from the torchtitan checkout (its tests/assets), in a
# process group of its own; output in $OUT/logs/run-N.out.
run() {
  (cd "$SRC" && exec setsid "$PYTHON" -m tessera.run --coordinator=127.0.0.1:"$port" \
    --job=titan --layout=fsdp="$GPUS" --agent-bin="$AGENT" -- \
    torchrun --standalone --nproc_per_node="$GPUS" -m torchtitan.train \
    --module tessera_config --config llama3_debugmodel_tessera \
    --dump_folder="$OUT/dump" --training.steps=15) >"$OUT/logs/run-$1.out" 2>&1 &
  run_pid=$!
}
run 1
for _ in $(seq 1200); do
  grep -q "Tessera: step 5 committed" "$OUT/logs/run-1.out" && break
  kill -0 "$run_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q "Tessera: step 5 committed" "$OUT/logs/run-1.out" ||
  { echo "FAIL: run 1 committed no step 5: $(tail -n 20 "$OUT/logs/run-1.out")"; exit 1; }
kill -KILL -- -"$run_pid" 2>/dev/null
wait "$run_pid" 2>/dev/null
# The newest committed step (run 1 may have gone on past step 5 before it was killed).
last=$(ls "$OUT/ckpt/titan" | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n 1)
[ "$last" -lt 15 ] || { echo "FAIL: run 1 finished (step $last) before it was killed"; exit 1; }
echo "run 1: step $last committed, then every process SIGKILLed"
run 2
wait "$run_pid" || { echo "FAIL: run 2 exited $?: $(tail -n 20 "$OUT/logs/run-2.out")"; exit 1; }
for line in "Tessera: loaded step $last " "Training starts at step $((last + 1))" \
  "Tessera: step 15 committed" \
  "Tessera: the model of step 15 exported to $OUT/dump/checkpoint/step-15/model.safetensors"; do
  grep -qF "$line" "$OUT/logs/run-2.out" || { echo "FAIL: run 2 printed no '$line'"; exit 1; }
done
"$TESSERA_CLI" verify "$OUT/ckpt/titan/step-$(printf %09d 15)" || exit 1
echo "PASS: torchtitan's debug model on $GPUS GPU(s): saved every 5 steps through Tessera," \
  "killed after step $last's commit, resumed from it, step 15 saved and exported (logs: $OUT/logs)"
