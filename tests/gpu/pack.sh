#!/usr/bin/env bash
# Packs built Tessera binaries for a machine that has none of their libraries (the GPU
# machine: tests/gpu/run.sh). Writes PACK/:
#   bin/<package>/<name>   each binary, debug info stripped (symbols kept for stack traces)
#   lib/<soname>           every shared library they load (ldd, transitively) that the
#                          image does not provide (tests/gpu/image_libs.txt)
#   scripts/               what runs there: on_device.sh, report.py, dcp_peer.py, check_pack.sh,
#                          plan_run.sh,
#                          image_libs.txt and deploy/lib's cluster helpers
#   MANIFEST.txt           what is in it, from which commit, and what the image must provide
#
#   pack.sh --bin=DIR --src=DIR --out=PACK PATH...
#   pack.sh --bin=DIR --src=DIR --list PATH...   print what would be packed, write nothing
#     DIR of --bin:  where the binaries are (bazel-bin, or a test's runfiles root)
#     DIR of --src:  the repository root the scripts are copied from
#     PATH...:       binaries relative to --bin, e.g. server/tessera-coordinator
#
# Exits 1, naming it, if a binary is missing or a library ldd cannot find is not one the image
# provides. Uses ldd, readelf and strip (binutils, glibc): no tool of our own.
set -uo pipefail

BIN="" SRC="" PACK="" LIST=0
paths=()
for arg in "$@"; do
  case "$arg" in
    --bin=*) BIN=${arg#*=} ;;
    --src=*) SRC=${arg#*=} ;;
    --out=*) PACK=${arg#*=} ;;
    --list) LIST=1 ;;
    -*) echo "pack.sh: unknown option $arg" >&2; exit 2 ;;
    *) paths+=("$arg") ;;
  esac
done
if [ "$LIST" = 1 ]; then PACK=$(mktemp -d); trap 'rm -rf "$PACK"' EXIT; fi
[ -n "$BIN" ] && [ -n "$SRC" ] && [ -n "$PACK" ] && [ ${#paths[@]} -gt 0 ] ||
  { echo "usage: pack.sh --bin=DIR --src=DIR --out=PACK PATH..." >&2; exit 2; }
die() { echo "pack.sh: $*" >&2; exit 1; }

IMAGE_LIBS="$SRC/tests/gpu/image_libs.txt"
[ -f "$IMAGE_LIBS" ] || die "$IMAGE_LIBS is missing"
image_provides() { grep -v '^#' "$IMAGE_LIBS" | grep -qxF -- "$1"; }

rm -rf "$PACK"
mkdir -p "$PACK/bin" "$PACK/lib" "$PACK/scripts/deploy/lib" || die "cannot create $PACK"

declare -A libs=()  # soname -> path on this machine
for p in "${paths[@]}"; do
  f="$BIN/$p"
  [ -f "$f" ] || die "$f is missing (build it first)"
  mkdir -p "$PACK/bin/$(dirname "$p")"
  # --strip-debug: the -g1 line tables are most of each binary; the symbol table stays.
  strip --strip-debug -o "$PACK/bin/$p" "$f" || die "strip $f failed"
  chmod 755 "$PACK/bin/$p"
  # ldd lists the whole closure: NEEDED entries of the binary and of every library.
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then  # "libx.so => not found"
      image_provides "$name" || die "$p needs $name, which ldd cannot find here and the image does not provide"
      continue
    fi
    image_provides "$name" || libs[$name]=$path
  done < <(ldd "$f")
done

if [ "$LIST" = 1 ]; then
  total=0
  for p in "${paths[@]}"; do
    n=$(stat -c %s "$PACK/bin/$p"); total=$((total + n))
    printf '  binary   %-44s %9d bytes (debug info stripped)\n' "$p" "$n"
  done
  for name in $(printf '%s\n' "${!libs[@]}" | sort); do
    n=$(stat -L -c %s "${libs[$name]}"); total=$((total + n))
    printf '  library  %-44s %9d bytes (from %s)\n' "$name" "$n" "${libs[$name]}"
  done
  echo "  from the image, not carried: $(grep -v '^#' "$IMAGE_LIBS" | grep . | tr '\n' ' ')"
  echo "  total $total bytes ($(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }') MiB) before the scripts"
  exit 0
fi
for name in "${!libs[@]}"; do
  cp -L "${libs[$name]}" "$PACK/lib/$name" || die "cannot copy ${libs[$name]}"
done

cp "$SRC/tests/gpu/on_device.sh" "$SRC/tests/gpu/report.py" "$SRC/tests/gpu/dcp_peer.py" \
  "$SRC/tests/gpu/check_pack.sh" "$SRC/tests/bench/plan_run.sh" "$IMAGE_LIBS" "$PACK/scripts/" ||
  die "cannot copy the scripts"
cp "$SRC/deploy/lib/procs.sh" "$SRC/deploy/lib/cluster.sh" "$PACK/scripts/deploy/lib/" ||
  die "cannot copy deploy/lib"

# The newest glibc / libstdc++ symbol versions any packed file needs: the image must have them.
max_version() {
  find "$PACK/bin" "$PACK/lib" -type f -exec readelf -V --wide {} + 2>/dev/null |
    grep -o "Name: $1_[0-9.]*" | sed "s/Name: $1_//" | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -n 1
}
commit=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$SRC" diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
{
  echo "# Tessera GPU pack (tests/gpu/pack.sh). Run there: tests/gpu/run.sh --on-device"
  echo "commit=$commit"
  echo "built_on=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version | head -n 1)"
  echo "needs_glibc=$(max_version GLIBC)"
  echo "needs_glibcxx=$(max_version GLIBCXX)"
  echo "image_provides=$(grep -v '^#' "$IMAGE_LIBS" | grep . | tr '\n' ' ')"
  echo "binaries:"
  (cd "$PACK/bin" && find . -type f | sed 's|^\./||' | sort | while read -r f; do
    echo "  $f $(stat -c %s "$f")"; done)
  echo "libraries:"
  (cd "$PACK/lib" && for f in $(ls | sort); do echo "  $f $(stat -c %s "$f")"; done)
  echo "bytes=$(du -sb "$PACK" | cut -f1)"
} >"$PACK/MANIFEST.txt"
echo "pack.sh: ${#paths[@]} binaries, ${#libs[@]} libraries, $(du -sb "$PACK" | cut -f1) bytes in $PACK"
