#!/usr/bin/python3
"""An independent safetensors reader, written from the published format only.

Format (https://github.com/huggingface/safetensors, "Format"): 8 bytes little-endian
unsigned header length N; N bytes of UTF-8 JSON starting with '{' (trailing spaces allowed);
then the data section. Each JSON entry is {"dtype", "shape", "data_offsets": [begin, end]},
offsets relative to the data section; "__metadata__" is a map of strings. The entries must
tile the data section without holes or overlaps, and each entry's byte count must equal
prod(shape) * size(dtype).

Prints one line per entry in data order: name, dtype, shape, sha256 of its bytes. With
--machine the name is printed as the hex of its UTF-8 bytes and the bytes' hex is appended,
tab-separated, for tests. Exits 1 with a message if the file violates the format.
Standard library only (json, struct, hashlib), so it shares no code with the C++ writer.
"""
import hashlib
import json
import struct
import sys

DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def fail(message):
    sys.exit("read_safetensors: " + message)


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        fail("duplicate key in header")
    return dict(pairs)


def main(argv):
    machine = "--machine" in argv
    paths = [a for a in argv if not a.startswith("--")]
    if len(paths) != 1:
        fail("usage: read_safetensors.py [--machine] FILE")
    with open(paths[0], "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file shorter than the length prefix")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        fail("header length %d exceeds the file" % n)
    text = blob[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        fail("header does not start with '{'")
    header = json.loads(text, object_pairs_hook=no_duplicates)
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        fail("__metadata__ must map strings to strings")
    entries = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    cursor = 0
    for name, info in entries:
        if set(info) != {"dtype", "shape", "data_offsets"}:
            fail("entry %r has fields %s" % (name, sorted(info)))
        begin, end = info["data_offsets"]
        size = DTYPE_SIZES.get(info["dtype"])
        if size is None:
            fail("entry %r has unknown dtype %r" % (name, info["dtype"]))
        for d in info["shape"]:
            size *= d
        if begin != cursor or end - begin != size:
            fail("entry %r at [%d, %d) breaks the tiling at %d" % (name, begin, end, cursor))
        cursor = end
        body = data[begin:end]
        shape = ",".join(str(d) for d in info["shape"])
        digest = hashlib.sha256(body).hexdigest()
        if machine:
            print("\t".join([name.encode("utf-8").hex(), info["dtype"], shape, digest, body.hex()]))
        else:
            print("%s %s [%s] sha256=%s" % (name, info["dtype"], shape, digest))
    if cursor != len(data):
        fail("entries cover %d bytes of a %d-byte data section" % (cursor, len(data)))


if __name__ == "__main__":
    main(sys.argv[1:])
