"""Fuzzes the decoder of the objects encoding (tessera.objects.decode) with atheris (libFuzzer
for Python). Its contract: bytes that are not a valid document raise ValueError, whatever they
claim, and nothing is allocated for a tensor or array before its bytes are known to be there.
Any other exception, a crash or running out of memory is a finding.

  objects_fuzzer.py [libFuzzer flags] [CORPUS_DIR...]     fuzz (as any libFuzzer binary)
  objects_fuzzer.py --replay DIR                          run every input of DIR once
  objects_fuzzer.py --write-seeds DIR                     write the seed corpus (encode's)

Under Bazel (tests/fuzz:objects_fuzz_test) it replays tests/fuzz/regressions/objects/, then
fuzzes from tests/fuzz/corpus/objects/ into a fresh directory, as tests/fuzz/run_fuzzer.sh
does for the C++ targets.
"""

import os
import sys
import tempfile

import atheris

# tessera/objects.py alone, as a top-level module seen through a directory that holds nothing
# else: it imports nothing of the package, whose __init__ loads the C++ extension, and the
# package's own tessera/torch.py must not shadow torch.
_ALONE = tempfile.mkdtemp(prefix="objects_fuzzer.")
os.symlink(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client",
                        "python", "tessera", "objects.py"), os.path.join(_ALONE, "objects.py"))
sys.path.insert(0, _ALONE)
with atheris.instrument_imports(include=["objects"]):
    import objects


def test_one_input(data):
    try:
        objects.decode(data, name="fuzz")
    except ValueError:
        pass


def write_seeds(out):
    import numpy as np
    import torch
    values = {
        "scheduler": {"last_epoch": 7, "base_lrs": [0.001, 0.0005], "_step_count": 8,
                      "warmup": (100, 0.1), "nan": float("nan"), "inf": float("-inf")},
        "rng": {"torch": torch.arange(8, dtype=torch.uint8),
                "numpy": ("MT19937", np.arange(4, dtype=np.uint32), 2, 0, 0.0),
                "python": (3, (1, 2, 3), None)},
        "loader": {1: b"\x00\x01position", "epoch": np.int64(3), "weights":
                   torch.ones(2, 3, dtype=torch.bfloat16)},
    }
    os.makedirs(out, exist_ok=True)
    for name, value in values.items():
        with open(os.path.join(out, name + ".json"), "wb") as f:
            f.write(objects.encode(value))


def main(argv):
    if len(argv) == 3 and argv[1] == "--write-seeds":
        return write_seeds(argv[2])
    if len(argv) == 3 and argv[1] == "--replay":
        for name in sorted(os.listdir(argv[2])):
            with open(os.path.join(argv[2], name), "rb") as f:
                test_one_input(f.read())
        print("replayed %d inputs" % len(os.listdir(argv[2])))
        return 0
    if "TEST_TMPDIR" in os.environ and "--" not in argv:
        # The short run (fuzz.bzl): regressions first, then new inputs into a fresh directory.
        here = os.path.join("tests", "fuzz")
        regressions = os.path.join(here, "regressions", "objects")
        if os.path.isdir(regressions):
            main([argv[0], "--replay", regressions])
        work = os.path.join(os.environ["TEST_TMPDIR"], "corpus")
        os.makedirs(work, exist_ok=True)
        artifacts = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", os.environ["TEST_TMPDIR"])
        argv = argv + ["-artifact_prefix=" + artifacts + "/", work,
                       os.path.join(here, "corpus", "objects")]
    atheris.Setup([a for a in argv if a != "--"], test_one_input)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
