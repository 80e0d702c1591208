#!/usr/bin/env bash
# Checks a pack made by tests/gpu/pack.sh, here or on the GPU machine:
#   1. every NEEDED entry (readelf -d) of every packed binary and library is a library in the
#      pack or one the image provides (image_libs.txt);
#   2. with LD_LIBRARY_PATH at the pack, ldd -r resolves every binary's libraries to the pack
#      or to the image's list (nothing else from this machine's /usr/lib), with no undefined
#      symbol or missing symbol version;
#   3. the pack carries none of the image's libraries;
#   4. the pack as carried (its archive, where one is named) plus the working tree that travels
#      with it fit the device tool's limit.
# Prints one line per problem and a summary; exits 1 if anything failed.
#
#   check_pack.sh --pack=PACK [--image-libs=FILE] [--carried-bytes=N] [--tree-bytes=N]
#                 [--limit-bytes=N]
#     --no-size-check: leave 4. out (on the device, where the pack has already arrived)
#     --carried-bytes: the bytes the device tool carries for the pack (its .tar.gz archive);
#                      default: the unpacked pack's own size
#     --tree-bytes:  the working tree's bytes that travel with the pack (default 0)
#     --limit-bytes: default 67108864 (64 MiB: the device tool's limit for tree + carry)
#     --extra-lib-dir=DIR  also accept libraries found in DIR (on the device: NCCL's folder)
set -uo pipefail

PACK="" IMAGE_LIBS="" CARRIED="" SIZE_CHECK=1 TREE_BYTES=0 LIMIT=$((64 << 20)) EXTRA=""
for arg in "$@"; do
  case "$arg" in
    --pack=*) PACK=${arg#*=} ;;
    --image-libs=*) IMAGE_LIBS=${arg#*=} ;;
    --carried-bytes=*) CARRIED=${arg#*=} ;;
    --no-size-check) SIZE_CHECK=0 ;;
    --tree-bytes=*) TREE_BYTES=${arg#*=} ;;
    --limit-bytes=*) LIMIT=${arg#*=} ;;
    --extra-lib-dir=*) EXTRA=${arg#*=} ;;
    *) echo "check_pack.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
[ -d "$PACK/bin" ] && [ -d "$PACK/lib" ] || { echo "check_pack.sh: $PACK is not a pack" >&2; exit 2; }
PACK=$(cd "$PACK" && pwd)
IMAGE_LIBS=${IMAGE_LIBS:-$PACK/scripts/image_libs.txt}
declare -A IMAGE=()
while read -r soname; do IMAGE[$soname]=1; done < <(grep -v '^#' "$IMAGE_LIBS" | grep .)
image_provides() { [ -n "${IMAGE[$1]:-}" ]; }

problems=0
problem() { echo "check_pack: FAIL: $*"; problems=$((problems + 1)); }

mapfile -t binaries < <(find "$PACK/bin" -type f | sort)
mapfile -t libraries < <(find "$PACK/lib" -type f | sort)
[ ${#binaries[@]} -gt 0 ] || problem "no binaries in $PACK/bin"

# 1. NEEDED entries.
needed_total=0
command -v readelf >/dev/null 2>&1 ||
  echo "check_pack: note: no readelf (binutils) here: NEEDED entries unchecked; ldd -r below still is"
for f in "${binaries[@]}" "${libraries[@]}"; do
  command -v readelf >/dev/null 2>&1 || break
  while read -r soname; do
    needed_total=$((needed_total + 1))
    [ -f "$PACK/lib/$soname" ] && continue
    image_provides "$soname" && continue
    problem "${f#$PACK/} needs $soname: neither in the pack nor provided by the image"
  done < <(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done

# 2. What the loader actually picks, with the pack first on the search path.
declare -A from_image=()
from_pack=0
for f in "${binaries[@]}"; do
  out=$(LD_LIBRARY_PATH="$PACK/lib${EXTRA:+:$EXTRA}" ldd -r "$f" 2>&1)
  while read -r line; do
    case "$line" in
      *"undefined symbol"*|*"version \`"*"not found"*)
        problem "${f#$PACK/}: $line" ;;
      *"=> not found"*)
        name=${line%% *}
        image_provides "$name" || problem "${f#$PACK/}: $name not found" ;;
      *" => "*)
        name=${line%% *}
        path=${line#* => }
        path=${path%% *}
        if [[ "$path" == "$PACK/lib/"* ]]; then
          from_pack=$((from_pack + 1))
        elif [ -n "$EXTRA" ] && [[ "$path" == "$EXTRA/"* ]]; then
          from_image[$name]=1
        elif image_provides "$name"; then
          from_image[$name]=1
        else
          problem "${f#$PACK/}: $name resolves to $path, outside the pack, and the image does not provide it"
        fi ;;
    esac
  done <<<"$out"
done

# 3. Nothing the image has (a second libc or driver library would break the process there).
for f in "${libraries[@]}"; do
  image_provides "$(basename "$f")" && problem "the pack carries $(basename "$f"), which the image provides"
done

# 4. Size.
pack_bytes=${CARRIED:-$(du -sb "$PACK" | cut -f1)}
total=$((pack_bytes + TREE_BYTES))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
[ "$SIZE_CHECK" = 0 ] || [ "$total" -le "$LIMIT" ] ||
  problem "pack as carried $(mib "$pack_bytes") + working tree $(mib "$TREE_BYTES") = $(mib "$total"), over the limit of $(mib "$LIMIT")"

echo "check_pack: ${#binaries[@]} binaries, ${#libraries[@]} libraries; $needed_total NEEDED entries checked;" \
  "ldd: $from_pack resolutions from the pack, from the image: $(echo "${!from_image[@]}" | tr ' ' '\n' | sort | tr '\n' ' ')"
[ "$SIZE_CHECK" = 0 ] ||
  echo "check_pack: size: pack as carried $(mib "$pack_bytes") + working tree $(mib "$TREE_BYTES") = $(mib "$total") of $(mib "$LIMIT")"
if [ "$problems" -gt 0 ]; then
  echo "check_pack: $problems problem(s)"
  exit 1
fi
echo "check_pack: OK"
