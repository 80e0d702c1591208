#!/usr/bin/env bash
# The GPU path run for real (issue 13), in one command on each side.
#
#   tests/gpu/run.sh              here (Bazel, no GPU needed): build the binaries, pack them
#                                 with the libraries the GPU image lacks into .device/gpu-pack
#                                 (git-ignored), archive it as .device/gpu-pack.tar.gz (what is
#                                 carried: the libraries gzip to under half, and the device
#                                 tool's limit counts carried bytes), check the pack, and print
#                                 the device-tool call
#   tests/gpu/run.sh --dry-run    list what would be built, carried and run there; builds
#                                 nothing (Bazel is only queried)
#   tests/gpu/run.sh --on-device [options]
#                                 on the GPU machine, from the repository root with the pack's
#                                 archive carried: unpacks it beside itself (replacing any
#                                 older unpacked copy), then runs the pack's scripts/on_device.sh (GPU-tagged
#                                 tests, CUDA saves and loads through a real coordinator and
#                                 agents, the pinned-copy limit, DCP async_save, memcheck) and
#                                 writes results.md and 5 more files into $OUT. Its options:
#                                 tests/gpu/on_device.sh --help
#
# Options here: --pack=DIR (default .device/gpu-pack), --no-build (pack what bazel-bin holds).
# What is packed: every cc_binary and cc_test in the data of //tests/gpu:pack_test, which must
# include every test tagged "gpu" (this script refuses to pack otherwise).
set -uo pipefail
cd "$(dirname "$0")/../.."
PACK=.device/gpu-pack
MODE=pack
BUILD=1
args=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) MODE=dry ;;
    --on-device) MODE=device ;;
    --pack=*) PACK=${arg#*=} ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$arg") ;;
  esac
done
LIMIT=$((64 << 20))  # the device tool: working tree + carried paths

ARCHIVE=$PACK.tar.gz
if [ "$MODE" = device ]; then
  if [ -f "$ARCHIVE" ]; then
    rm -rf "$PACK" && mkdir -p "$PACK" && tar -xzf "$ARCHIVE" -C "$PACK" || {
      echo "run.sh: cannot unpack $ARCHIVE into $PACK" >&2
      exit 1
    }
  fi
  [ -f "$PACK/scripts/on_device.sh" ] || {
    echo "run.sh: no pack at $PACK: build it where Bazel is (tests/gpu/run.sh) and carry it" >&2
    exit 1
  }
  exec bash "$PACK/scripts/on_device.sh" --pack="$PACK" "${args[@]}"
fi
[ ${#args[@]} -eq 0 ] || { echo "run.sh: unknown option ${args[*]} (see --help)" >&2; exit 2; }
die() { echo "run.sh: $*" >&2; exit 1; }

# --- what to pack
packed=$(bazel query 'kind("cc_(binary|test) rule", labels(data, //tests/gpu:pack_test))' 2>/dev/null | sort) ||
  die "bazel query failed"
gpu_tagged=$(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null | sort)
missing=$(comm -13 <(echo "$packed") <(echo "$gpu_tagged") | grep . || true)
[ -z "$missing" ] || die "gpu-tagged tests not packed (add them to GPU_TAGGED_TESTS in tests/gpu/BUILD.bazel): $missing"
paths=()
for label in $packed; do
  l=${label#//}
  paths+=("${l%%:*}/${l#*:}")
done
CALL_COMMAND="tests/gpu/run.sh --on-device"
print_call() {
  echo "The device-tool call (one call: on_device.sh starts nothing after 540 s, so allow the whole"
  echo "600 s; results come back from \$OUT, and the reply's output ends with results.md):"
  echo "  run(command=\"$CALL_COMMAND\", carry=[\"$ARCHIVE\"], timeout_s=600)"
  echo "then read, under the folder the reply names (files_at): results.md (the page for"
  echo "docs/benchmarks/), tests.txt, memcheck.txt, results.json, run.log, logs.tar.gz."
}

tree_bytes() {  # what the device tool sends besides carried paths: the tree, and shared/ if here
  local n s=0
  n=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
  if [ -d shared ] && git check-ignore -q shared; then s=$(du -sb shared | cut -f1); fi
  echo $((n + s))
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

if [ "$MODE" = dry ]; then
  echo "run.sh --dry-run: nothing is built or written."
  echo
  echo "Here: bazel build, then pack into $PACK (git-ignored: $(git check-ignore -q "$PACK" && echo yes || echo NO)):"
  printf '  %s\n' $packed
  echo "gpu-tagged tests (bazel query): $(echo $gpu_tagged)"
  bin=$(bazel info bazel-bin 2>/dev/null)
  have=1
  for p in "${paths[@]}"; do [ -f "$bin/$p" ] || have=0; done
  if [ "$have" = 1 ]; then
    echo "What would be carried, from the binaries bazel-bin holds now (ldd; may be stale):"
    bash tests/gpu/pack.sh --bin="$bin" --src=. --list "${paths[@]}"
  else
    echo "What would be carried: those binaries (debug info stripped) and the libraries ldd finds"
    echo "for them that tests/gpu/image_libs.txt does not list (not built yet, so not listed)."
  fi
  echo "  + scripts/: on_device.sh report.py dcp_peer.py check_pack.sh image_libs.txt deploy/lib/{procs,cluster}.sh"
  echo "Working tree that travels too: $(mib "$(tree_bytes)") (limit for tree + carry: $(mib $LIMIT))"
  echo
  echo "There:"
  bash tests/gpu/on_device.sh --plan --pack="$PACK"
  echo
  print_call
  exit 0
fi

# --- build, pack, check
if [ "$BUILD" = 1 ]; then
  echo "run.sh: bazel build ${#paths[@]} targets"
  bazel build $packed || die "the build failed"
fi
bin=$(bazel info bazel-bin 2>/dev/null) || die "bazel info failed"
git check-ignore -q "$PACK" || die "$PACK is not git-ignored: the device tool would send it twice"
bash tests/gpu/pack.sh --bin="$bin" --src=. --out="$PACK" "${paths[@]}" || die "packing failed"
tar -czf "$ARCHIVE" -C "$PACK" . || die "cannot archive $PACK as $ARCHIVE"
tree=$(tree_bytes)
bash tests/gpu/check_pack.sh --pack="$PACK" --carried-bytes="$(stat -c %s "$ARCHIVE")" \
  --tree-bytes="$tree" --limit-bytes="$LIMIT" ||
  die "the pack failed its check (above)"
echo
print_call
