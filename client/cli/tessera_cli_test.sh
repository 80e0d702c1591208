#!/bin/bash
# Runs the real `tessera` binary on a real checkpoint (client/cli/make_test_checkpoint.cc):
# help and usage errors, verify OK then a flipped data byte (exit 1 naming tensor, chunk and
# file), inspect --json, export --consolidate read back by an independent safetensors reader,
# and the unreachable-coordinator message.
set -u

TESSERA=client/cli/tessera
MAKE=client/cli/make_test_checkpoint
READER=format/testdata/read_safetensors.py
PYTHON=/usr/bin/python3
WORK=$(mktemp -d "${TEST_TMPDIR:-/tmp}/tessera_cli_test.XXXXXX")

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run EXPECTED_RC CMD...: runs CMD with stdout in $WORK/out and stderr in $WORK/err.
run() {
  local expected=$1
  shift
  "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  if [[ $rc -ne $expected ]]; then
    fail "'$*' exited $rc, expected $expected;" \
      "stdout: $(cat "$WORK/out"); stderr: $(cat "$WORK/err")"
  fi
}

expect_in() {  # expect_in FILE TEXT
  grep -qF -- "$2" "$1" || fail "$(basename "$1") lacks '$2': $(cat "$1")"
}

# --- help and usage ---------------------------------------------------------------------------
run 0 "$TESSERA" help
expect_in "$WORK/out" "verify DIR"
expect_in "$WORK/out" "watch JOB"
run 0 "$TESSERA" help verify
expect_in "$WORK/out" "Usage: tessera verify DIR"
"$TESSERA" --help >"$WORK/out" 2>&1
expect_in "$WORK/out" "--coordinator"
expect_in "$WORK/out" "--consolidate"
run 2 "$TESSERA"
run 2 "$TESSERA" frobnicate
expect_in "$WORK/err" 'unknown command "frobnicate"'
run 2 "$TESSERA" verify
expect_in "$WORK/err" "expected exactly 1 argument: DIR"
run 2 "$TESSERA" jobs --no_such_flag
expect_in "$WORK/err" "unknown flag --no_such_flag"

# --- verify a good checkpoint -----------------------------------------------------------------
CKPT="$WORK/step-000000100"
"$MAKE" "$CKPT" >"$WORK/chunk.sh" || { echo "make_test_checkpoint failed" >&2; exit 1; }
# shellcheck disable=SC1091
source "$WORK/chunk.sh"

run 0 "$TESSERA" verify "$CKPT"
expect_in "$WORK/out" "OK: 7 tensors, 17 chunks,"
expect_in "$WORK/out" "bytes verified"
run 0 "$TESSERA" verify "$CKPT" --json
"$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert d["ok"] and d["tensors"]==7, d' \
  <"$WORK/out" || fail "verify --json is not the expected JSON: $(cat "$WORK/out")"

run 2 "$TESSERA" verify "$WORK/no-such-dir"
expect_in "$WORK/err" "cannot read checkpoint directory"

# --- inspect ----------------------------------------------------------------------------------
run 0 "$TESSERA" inspect "$CKPT"
expect_in "$WORK/out" "layers.1.mlp#exp_avg"
expect_in "$WORK/out" "optimizer (absent)"
run 0 "$TESSERA" inspect "$CKPT" --json --chunks
"$PYTHON" - "$WORK/out" <<'PY' || fail "inspect --json: $(cat "$WORK/out")"
import json, sys
d = json.load(open(sys.argv[1]))
keys = {t["key"]: t for t in d["tensors"]}
assert d["step"] == 100 and d["job_id"] == "job", d
assert keys["layers.0.wq"]["shape"] == [8, 12] and keys["layers.0.wq"]["chunks"] == 4
assert keys["layers.0.wq"]["dtype"] == "F32" and keys["layers.0.wq"]["bytes"] == 384
assert keys["layers.1.mlp#exp_avg"]["state_absent"] is True
assert keys["rng#rank0"]["kind"] == "extra"
assert all(f["size"] is not None and f["size"] >= f["bytes"] for f in d["files"]), d["files"]
assert len(keys["layers.0.wq"]["chunk_list"]) == 4
PY

# --- export -----------------------------------------------------------------------------------
run 2 "$TESSERA" export "$CKPT" --out "$WORK/model.safetensors"
expect_in "$WORK/err" "needs --consolidate"
run 0 "$TESSERA" export "$CKPT" --consolidate --out "$WORK/model.safetensors"
expect_in "$WORK/out" "4 tensors"
expect_in "$WORK/out" "skipped 1 extra"
expect_in "$WORK/out" "recorded as absent"
expect_in "$WORK/out" "use --filter=all"
"$PYTHON" "$READER" --machine "$WORK/model.safetensors" | cut -f1,2,3,5 | sort >"$WORK/got" ||
  fail "the reader rejected the export"
sort "$CKPT.expected_params" >"$WORK/want"
cmp -s "$WORK/got" "$WORK/want" || fail "exported params differ from the saved tensors"

run 0 "$TESSERA" export "$CKPT" --consolidate --filter=all --out "$WORK/all.safetensors" --json
"$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert d["tensors"]==5, d' \
  <"$WORK/out" || fail "export --json: $(cat "$WORK/out")"
"$PYTHON" "$READER" --machine "$WORK/all.safetensors" | cut -f1,2,3,5 | sort >"$WORK/got" ||
  fail "the reader rejected the export"
sort "$CKPT.expected_all" >"$WORK/want"
cmp -s "$WORK/got" "$WORK/want" || fail "exported params + optimizer differ from the saved tensors"

run 2 "$TESSERA" export "$CKPT" --consolidate --filter=some --out "$WORK/x.safetensors"
expect_in "$WORK/err" 'unknown export filter "some"'

# --- a flipped byte ---------------------------------------------------------------------------
byte=$(od -An -tu1 -j "$CHUNK_OFFSET" -N1 "$CKPT/$CHUNK_FILE" | tr -d ' ')
printf "$(printf '\\%03o' $(((byte ^ 1) & 255)))" |
  dd of="$CKPT/$CHUNK_FILE" bs=1 seek="$CHUNK_OFFSET" conv=notrunc status=none
run 1 "$TESSERA" verify "$CKPT"
expect_in "$WORK/out" "FAILED: 1 problem"
expect_in "$WORK/out" "CHECKSUM_MISMATCH"
expect_in "$WORK/out" "$CHUNK_KEY"
expect_in "$WORK/out" "$CHUNK_BOX"
expect_in "$WORK/out" "$CHUNK_FILE"
# Export reads through the verifying reader: it must refuse, and leave nothing behind.
run 2 "$TESSERA" export "$CKPT" --consolidate --out "$WORK/bad.safetensors"
expect_in "$WORK/err" "checksum"
[[ ! -e "$WORK/bad.safetensors" && ! -e "$WORK/bad.safetensors.tessera-tmp" ]] ||
  fail "a failed export left a file"

# --- online, no coordinator -------------------------------------------------------------------
# A port nothing listens on: bind one, note it, release it.
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
TESSERA_COORDINATOR="127.0.0.1:$port" run 2 "$TESSERA" jobs
expect_in "$WORK/err" "cannot reach the coordinator at 127.0.0.1:$port"
expect_in "$WORK/err" "set --coordinator or TESSERA_COORDINATOR"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "PASS"
