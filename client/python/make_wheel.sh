#!/usr/bin/env bash
# Builds the wheel of the `tessera` package (//client/python:wheel): lays out an unpacked
# wheel — tessera/*.py and _tessera.so, tessera-VERSION.dist-info/{METADATA,WHEEL} — and lets
# `wheel pack` (Debian's python3-wheel) write RECORD with every file's hash and zip it.
#   make_wheel.sh VERSION TAG OUT_DIR FILE...
set -euo pipefail
version=$1 tag=$2 out=$3
shift 3
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
unpacked="$root/tessera-$version"
info="$unpacked/tessera-$version.dist-info"
mkdir -p "$unpacked/tessera" "$info"
for f in "$@"; do cp "$f" "$unpacked/tessera/$(basename "$f")"; done
cat >"$info/METADATA" <<META
Metadata-Version: 2.1
Name: tessera
Version: $version
Summary: Save and load training checkpoints through a Tessera agent (PyTorch DTensor/FSDP2 included)
Requires-Python: ==3.11.*
Description-Content-Type: text/plain

The Python client of Tessera, a checkpoint coordination service. The native extension links
the C++ client against Debian 12's gRPC, Protobuf and Abseil and the machine image's CUDA
runtime; install it where the Tessera agents run. torch and numpy are optional (tensors of
either are accepted) and are not installed by this package.
META
cat >"$info/WHEEL" <<META
Wheel-Version: 1.0
Generator: tessera make_wheel.sh
Root-Is-Purelib: false
Tag: $tag
META
# Fixed timestamps: the same inputs give the same wheel, byte for byte.
export SOURCE_DATE_EPOCH=315532800
/usr/bin/python3 -m wheel pack "$unpacked" --dest-dir "$out" >/dev/null
