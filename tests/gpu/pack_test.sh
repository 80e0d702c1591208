#!/usr/bin/env bash
# The GPU pack, checked here (no GPU needed). Arguments: the packed binaries' runfiles paths
# (tests/gpu/BUILD.bazel PACKED). Asserts:
#   1. pack.sh packs every binary and the libraries ldd finds that the image does not provide:
#      gRPC and RocksDB in, glibc, the driver library and NCCL out;
#   2. check_pack.sh passes: every NEEDED entry resolves to the pack or the image's list, and
#      the pack's archive (what the device tool carries) + working tree fit 64 MiB;
#      in a chroot holding only the pack and what the image provides (glibc, libstdc++, NCCL),
#      nothing else of this machine's /usr/lib, every binary's libraries resolve and it starts;
#   3. check_pack.sh fails, naming it, when a needed library is taken out, and when the pack
#      is over a limit;
#   4. the GPU run cannot fall back silently: tessera-gpu-bench --memory=cuda refuses a
#      machine without a GPU (where this machine has none);
#   5. run.sh --on-device unpacks the archive and the packed on_device.sh runs on its CPU fallback: the packed test binaries pass (their
#      GPU cases reported as skipped), a packed coordinator and agent save host tensors chosen
#      at run time (cudaGetDeviceCount fails) and reload them onto tp=2, every byte identical,
#      and results.md says it was a CPU fallback run.
set -uo pipefail
T=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "[${SECONDS}s] $*"; }
[ $# -gt 0 ] || fail "no binaries given"
paths=("$@")

# 1. Pack.
step "pack"
bash tests/gpu/pack.sh --bin=. --src=. --out="$T/pack" "${paths[@]}" >"$T/pack.out" 2>&1 ||
  fail "pack.sh: $(cat "$T/pack.out")"
for p in "${paths[@]}"; do
  [ -x "$T/pack/bin/$p" ] || fail "$p is not in the pack"
  grep -q "^  $p [0-9]" "$T/pack/MANIFEST.txt" || fail "MANIFEST.txt does not list $p"
done
for lib in libgrpc++.so.1.51 librocksdb.so.7.8 libprotobuf.so.32 libcudart.so.13; do
  [ -f "$T/pack/lib/$lib" ] || fail "$lib is not in the pack: $(ls "$T/pack/lib")"
done
for lib in libc.so.6 libstdc++.so.6 libcuda.so.1 libnccl.so.2; do
  [ -e "$T/pack/lib/$lib" ] && fail "the pack carries $lib, which the image provides"
done
[ -f "$T/pack/scripts/on_device.sh" ] && [ -f "$T/pack/scripts/deploy/lib/cluster.sh" ] ||
  fail "the scripts are not in the pack"
# What the device tool carries: the archive run.sh makes, unpacked there by run.sh --on-device.
tar -czf "$T/carried.tar.gz" -C "$T/pack" . || fail "cannot archive the pack"
bytes=$(stat -c %s "$T/carried.tar.gz")
[ "$bytes" -lt $((64 << 20)) ] || fail "the pack's archive is $bytes bytes, over 64 MiB"
echo "packed: ${#paths[@]} binaries, $(ls "$T/pack/lib" | wc -l) libraries," \
  "$(du -sb "$T/pack" | cut -f1) bytes, $bytes archived"

# 2. The check passes.
step "check"
bash "$T/pack/scripts/check_pack.sh" --pack="$T/pack" --carried-bytes="$bytes" >"$T/check.out" 2>&1 ||
  fail "check_pack.sh failed on a good pack: $(cat "$T/check.out")"
grep -q "^check_pack: OK$" "$T/check.out" || fail "no OK line: $(cat "$T/check.out")"
cat "$T/check.out"

# 2b. In a root that has nothing but the pack and what the image provides (glibc, the C++
# runtime, NCCL), none of this machine's other libraries (gRPC, RocksDB, ...), every packed
# binary's libraries resolve, to the pack or to those, and every binary starts.
step "chroot with the image's libraries only"
PATH=$PATH:/usr/sbin:/sbin  # chroot(8) lives there; Bazel's test PATH leaves them out
if [ "$(id -u)" != 0 ] || ! command -v chroot >/dev/null 2>&1; then
  echo "not checked: the chroot needs root and chroot(8) (uid $(id -u))"
else
  CHROOT=$(command -v chroot)
  R=$T/root
  L=$R/lib/x86_64-linux-gnu
  mkdir -p "$R/lib64" "$L" "$R/tmp" "$R/dev/shm"
  cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/" || fail "no /lib64/ld-linux-x86-64.so.2"
  for lib in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libstdc++.so.6 libgcc_s.so.1; do
    grep -qxF "$lib" tests/gpu/image_libs.txt || fail "$lib is not in image_libs.txt"
    cp -L "/lib/x86_64-linux-gnu/$lib" "$L/" || fail "cannot copy $lib"
  done
  # NCCL stands for the image's (208 MiB: linked, not copied, where the file system allows).
  nccl=$(readlink -f /usr/local/cuda/lib64/libnccl.so.2)
  ln "$nccl" "$L/libnccl.so.2" 2>/dev/null || cp "$nccl" "$L/libnccl.so.2" || fail "no NCCL to stand in"
  cp -r "$T/pack" "$R/pack"
  # env -i: Bazel's test variables name files outside the chroot.
  in_root() { env -i LD_LIBRARY_PATH=/pack/lib TESSERA_EXPECT_GPU=0 "$CHROOT" "$R" "$@"; }
  for p in "${paths[@]}"; do
    out=$(in_root /lib64/ld-linux-x86-64.so.2 --list "/pack/bin/$p" 2>&1) ||
      fail "$p in the chroot: $out"
    echo "$out" | grep "=>" | grep -v "=> /pack/lib/\|=> /lib/x86_64-linux-gnu/" &&
      fail "$p in the chroot resolves a library outside the pack and the image's"
    case "$p" in
      *_test) in_root "/pack/bin/$p" --gtest_list_tests >"$T/list.out" 2>&1 ||
          fail "$p --gtest_list_tests in the chroot: $(cat "$T/list.out")" ;;
      *) in_root "/pack/bin/$p" --help >"$T/help.out" 2>&1
         grep -q "^$(basename "$p"): " "$T/help.out" ||
           fail "$p --help in the chroot: $(head -c 500 "$T/help.out")" ;;
    esac
  done
  # The CUDA runtime from the pack, with no driver at all: the CPU branch, for real.
  in_root /pack/bin/shm/cuda_host_test >"$T/cuda_host.out" 2>&1 ||
    fail "cuda_host_test in the chroot: $(cat "$T/cuda_host.out")"
  grep -q "^\[  PASSED  \] 2 tests" "$T/cuda_host.out" ||
    fail "cuda_host_test in the chroot: $(tail -n 5 "$T/cuda_host.out")"
  rm -rf "$R"
  echo "chroot: ${#paths[@]} packed binaries resolve and start with only the image's libraries beside the pack"
fi

# 3. ... and fails where it must.
step "check, broken"
cp -r "$T/pack" "$T/broken"
rm "$T/broken/lib/libgrpc.so.29"
bash "$T/broken/scripts/check_pack.sh" --pack="$T/broken" >"$T/broken.out" 2>&1 &&
  fail "check_pack.sh passed a pack without libgrpc.so.29"
grep -q "needs libgrpc.so.29: neither in the pack nor provided by the image" "$T/broken.out" ||
  fail "the failure does not name libgrpc.so.29: $(cat "$T/broken.out")"
rm -rf "$T/broken"
bash "$T/pack/scripts/check_pack.sh" --pack="$T/pack" --carried-bytes="$bytes" \
  --tree-bytes=$((30 << 20)) --limit-bytes=$((bytes + (1 << 20))) >"$T/limit.out" 2>&1 &&
  fail "check_pack.sh passed a pack + tree over the limit"
grep -q "over the limit" "$T/limit.out" || fail "the size failure says: $(cat "$T/limit.out")"

# 4. No silent fallback on the GPU run.
step "--memory=cuda"
bench=$T/pack/bin/tests/gpu/tessera-gpu-bench
if [ -e /dev/nvidia0 ]; then
  echo "this machine has a GPU: the --memory=cuda refusal cannot be checked here"
else
  env LD_LIBRARY_PATH="$T/pack/lib" "$bench" save --agent=/nonexistent.sock --out="$T/x.json" \
    --memory=cuda >"$T/cuda.out" 2>&1
  rc=$?
  [ "$rc" = 1 ] || fail "--memory=cuda without a GPU exited $rc: $(cat "$T/cuda.out")"
  grep -q -- "--memory=cuda, but cudaGetDeviceCount finds no usable GPU" "$T/cuda.out" ||
    fail "--memory=cuda without a GPU says: $(cat "$T/cuda.out")"
  [ -e "$T/x.json" ] && fail "a report was written by a run that refused"
fi

# 5. The on-device script, unpacked from the archive by run.sh as on the device, on its CPU
# fallback.
step "run.sh --on-device --cpu-fallback"
[ -e "$T/carried" ] && fail "$T/carried exists before run.sh unpacks it"
LEASE_MS=2000 bash tests/gpu/run.sh --on-device --pack="$T/carried" --cpu-fallback \
  --out="$T/out" --data-dir="$T/data" --configs=8Mx1 --steps=2 --repeats=1 \
  --only=tests,configs --no-drop-caches --budget=240 --planning=2x2x2:12 --planning-repeats=1 \
  >"$T/device.out" 2>&1
rc=$?
[ "$rc" = 0 ] || { cat "$T/device.out"; fail "on_device.sh --cpu-fallback exited $rc"; }
for f in results.md results.json tests.txt memcheck.txt logs.tar.gz run.log; do
  [ -s "$T/out/$f" ] || fail "on_device.sh left no $f"
done
[ "$(ls "$T/out" | wc -l)" -le 8 ] || fail "more than 8 result files: $(ls "$T/out")"
grep -q "CPU fallback run: no GPU was used" "$T/out/results.md" ||
  fail "results.md does not say it was a CPU fallback run"
python3 - "$T/out/results.json" <<'EOF' || fail "results.json: see above"
import json, sys
d = json.load(open(sys.argv[1]))
run = d["8M-x1"]
saves, loads = run["saves"], run["loads"]
assert len(saves) == 1, "save ranks: %d" % len(saves)
assert saves[0]["memory"] == "host", "the save chose %s memory" % saves[0]["memory"]
assert [s["step"] for s in saves[0]["saves"]] == [1, 2], saves[0]["saves"]
assert saves[0]["bytes"] == 8 << 20, saves[0]["bytes"]
assert len(loads) == 2, "load ranks: %d" % len(loads)
for x in loads:
    assert x["memory"] == "host" and x["world"] == 2 and x["saved_world"] == 1, x
    assert x["step"] == 2 and x["expected_step"] == 2, x
    assert x["mismatched_tensors"] == 0 and x["mismatched_elements"] == 0, x
assert sum(x["bytes"] for x in loads) == 8 << 20
tests = d["tests"]
want = {"cuda_host_test", "staging_pool_test", "client_test", "nccl_peer_transport_test"}
assert want <= set(tests), sorted(tests)
for name, t in tests.items():
    outcomes = [c[1] for c in t["cases"]]
    assert t["rc"] == 0 and "failed" not in outcomes and "passed" in outcomes, (name, t)
skipped = {c[0]: c[2] for c in tests["cuda_host_test"]["cases"] if c[1] == "skipped"}
assert skipped == {"CudaHost.RegisterHost_WithGpu_PinsThenUnpins":
                   "no GPU on this machine: pinning cannot be checked"}, skipped
assert d["failures"] == [], d["failures"]
print("results.json: host memory chosen at run time; 8 MiB saved twice, reloaded on tp=2 "
      "byte for byte; %d test binaries passed" % len(tests))
EOF
step "results"
grep -q "^| 4 load tp=1 -> tp=2 into host memory, 8 MiB x 1 rank | .*every byte identical" \
  "$T/out/results.md" || fail "results.md has no identical-load row: $(cat "$T/out/results.md")"
# --planning: the planning benchmark's raw files come back in logs.tar.gz, as run.sh's would.
mkdir -p "$T/logs" && tar -xzf "$T/out/logs.tar.gz" -C "$T/logs" || fail "logs.tar.gz does not unpack"
planning=$T/logs/raw/planning
python3 - "$planning/raw/plan-2x2x2-12-1.json" <<'EOF' || fail "planning: $(cat "$planning"/logs/*.log)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] and d["ranks"] == 8 and d["cached_pins"] == 8, d
EOF
grep -q "plan validated" "$planning/raw/plan-events-2x2x2-12-1.txt" ||
  fail "the planning run kept no coordinator lines"
grep -q "^commit=" "$planning/raw/machine.env" || fail "the planning machine.env names no commit"
echo "PASS: pack built and checked ($bytes bytes), check fails without libgrpc and over the limit," \
  "--memory=cuda refuses without a GPU, packed CPU fallback saved and reloaded byte for byte," \
  "the packed planning run planned 8 ranks twice"
