"""End-to-end tests of the `tessera` Python module against a real coordinator and agents.

Started by python_e2e_test.sh, which runs the cluster: jobs "pydp" and "pyabs" (layout dp=2),
"pypp" and "pymem" (pp=2); agent sockets are $TESSERA_E2E_SOCK_DIR/<job>-<rank>.sock and the
coordinator's checkpoints are under $TESSERA_E2E_DIR/ckpt/<job>. Trainer ranks are separate
processes (trainer.py), one per agent, run in parallel as a real job would.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import tessera
import testlib

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "trainer.py")
SOCK_DIR = os.environ.get("TESSERA_E2E_SOCK_DIR", "")
RUN_DIR = os.environ.get("TESSERA_E2E_DIR", "")
TIMEOUT_S = 240


def sock(job, rank):
    return os.path.join(SOCK_DIR, "%s-%d.sock" % (job, rank))


def run_ranks(job, world, mode, *args):
    """Runs `trainer.py mode args` for every rank of `job` in parallel; returns their JSON
    reports, in rank order."""
    procs = []
    for rank in range(world):
        # -P: the script's real directory (client/python) must not shadow the built package.
        cmd = [sys.executable, "-P", TRAINER, mode, "--agent", sock(job, rank)] + list(args)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    reports = []
    failures = []
    for rank, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("%s rank %d of %s timed out" % (mode, rank, job))
        if p.returncode != 0:
            failures.append("rank %d exited %d:\n%s" % (rank, p.returncode, stderr[-3000:]))
            continue
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    if failures:
        raise AssertionError("%s on %s failed:\n%s" % (mode, job, "\n".join(failures)))
    return sorted(reports, key=lambda r: r.get("rank", 0))


@unittest.skipUnless(SOCK_DIR and RUN_DIR, "needs the cluster of python_e2e_test.sh")
class SaveLoadDp2Test(unittest.TestCase):
    """Two dp ranks train a model with AdamW and save model + optimizer state + objects at
    steps 1 and 2; fresh processes load them back and compare bitwise."""

    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp(dir=RUN_DIR)
        cls.saves = run_ranks("pydp", 2, "save", "--out", cls.out, "--steps", "1,2")
        cls.loads = run_ranks("pydp", 2, "load", "--out", cls.out)

    def test_Save_Dp2_CommitsEveryStep(self):
        for report in self.saves:
            self.assertEqual([s["step"] for s in report["saves"]], [1, 2])
            for s in report["saves"]:
                self.assertTrue(os.path.isfile(os.path.join(s["dir"], "manifest.pb")), s["dir"])
                self.assertTrue(s["dir"].endswith("step-%09d" % s["step"]), s["dir"])
                self.assertGreaterEqual(s["stall_seconds"], 0.0)
            self.assertEqual(report["latest"], 2)
        # Both ranks took part in the same sessions.
        self.assertEqual([s["session_id"] for s in self.saves[0]["saves"]],
                         [s["session_id"] for s in self.saves[1]["saves"]])

    def test_Save_UnchangedTensors_PlanCached(self):
        for report in self.saves:
            cached = [s["plan_cached"] for s in report["saves"]]
            # Step 2 describes the same tensors (and same-sized objects) as step 1.
            self.assertEqual(cached, [False, True])

    def test_Reserve_BothRegionsMappedBeforeTheFirstSave_NoSaveMapsAnother(self):
        for report in self.saves:
            # The agents keep the last commit in memory: saves alternate between two regions,
            # both reserved and mapped before step 1.
            self.assertEqual(report["maps_after_reserve"], 2, report)
            self.assertEqual(report["staging_maps"], 2, report)

    def test_Identity_Dp2_RankAndCoords(self):
        for rank, report in enumerate(self.saves):
            identity = report["identity"]
            self.assertEqual(identity["job"], "pydp")
            self.assertEqual(identity["rank"], rank)
            self.assertEqual(identity["coords"], {"dp": rank})
            self.assertEqual(identity["layout"], {"dp": 2})

    def test_LoadLatest_FreshProcesses_BitwiseIdenticalTensorsAndObjects(self):
        for report in self.loads:
            self.assertEqual(report["step"], 2)
            self.assertEqual(report["mismatches"], [])

    def test_LoadOlderStep_Parameters_BitwiseIdentical(self):
        for report in self.loads:
            self.assertEqual(report["step1"], 1)
            self.assertEqual(report["latest"], 2)


@unittest.skipUnless(SOCK_DIR and RUN_DIR, "needs the cluster of python_e2e_test.sh")
class AbsentOptimizerStateTest(unittest.TestCase):
    """Step 0 is saved before the first optimizer step (every parameter's state declared
    tessera.Absent), step 1 with a frozen layer whose state stays absent; both must commit,
    step 1 must load back bitwise, the frozen layer's state still absent, and step 0 must load
    into a fresh optimizer leaving every parameter without state."""

    def test_SaveAbsentState_CommitsAndLoads(self):
        out = tempfile.mkdtemp(dir=RUN_DIR)
        saves = run_ranks("pyabs", 2, "save", "--out", out, "--steps", "0,1", "--frozen")
        for report in saves:
            self.assertEqual([s["step"] for s in report["saves"]], [0, 1])
            self.assertEqual(report["latest"], 1)
        loads = run_ranks("pyabs", 2, "load", "--out", out, "--frozen")
        for report in loads:
            # Step 0 loaded too: no parameter keeps the state init_optimizer_state made up.
            self.assertEqual((report["step"], report["step1"], report["step0"]), (1, 1, 0))
            self.assertEqual(report["mismatches"], [])


@unittest.skipUnless(SOCK_DIR and RUN_DIR, "needs the cluster of python_e2e_test.sh")
class PlanRejectionTest(unittest.TestCase):
    """Two pp stages name their layer alike: the torchtitan bug, refused before any copy."""

    def test_Save_DuplicateFqnAcrossStages_RaisesTesseraError(self):
        reports = run_ranks("pypp", 2, "dup")
        for report in reports:
            self.assertEqual(report["raised"], "InvalidArgumentError", report)
            self.assertTrue(report["is_invalid_argument"])
            self.assertEqual(report["code"], "DUPLICATE_FQN", report)
            self.assertIn("layers.0.weight", report["fqns"])
            self.assertIsNone(report["latest"])  # nothing was committed
        self.assertFalse(os.path.exists(os.path.join(RUN_DIR, "ckpt", "pypp", "step-000000005")))

    def test_Load_NoCheckpoint_NotFoundError(self):
        client = tessera.Client(sock("pypp", 0), connect_timeout=30)
        with self.assertRaises(tessera.NotFoundError) as ctx:
            client.load("latest", into={})
        self.assertEqual(ctx.exception.code, "CHECKPOINT_NOT_FOUND")
        self.assertIsNone(client.latest())

    def test_Wait_UnknownStep_RaisesTesseraError(self):
        client = tessera.Client(sock("pypp", 1), connect_timeout=30)
        with self.assertRaises(tessera.TesseraError) as ctx:
            client.wait(12345, timeout=5)
        self.assertIsInstance(ctx.exception, (tessera.NotFoundError,
                                              tessera.DeadlineExceededError))


def flip_resident_byte(job, rank, marker, past):
    """Flips the byte `past` bytes after `marker` in the shared memory of `job`'s agent of
    `rank` (its staging regions, /dev/shm/tessera-<job>-r<rank>-*); returns the region's path."""
    for name in sorted(os.listdir("/dev/shm")):
        if not name.startswith("tessera-%s-r%d-" % (job, rank)):
            continue
        path = os.path.join("/dev/shm", name)
        with open(path, "r+b") as f:
            at = f.read().find(marker)
            if at < 0:
                continue
            f.seek(at + past)
            b = f.read(1)
            f.seek(at + past)
            f.write(bytes([b[0] ^ 0x5A]))
            return path
    raise AssertionError("no staging region of %s rank %d holds the saved tensor" % (job, rank))


@unittest.skipUnless(SOCK_DIR and RUN_DIR, "needs the cluster of python_e2e_test.sh")
class MemoryTierInPlaceTest(unittest.TestCase):
    """pp=2, each stage one tensor of its own (DESIGN.md "Memory tier"): restarted trainers
    load step 10 from their agents' memory in place, through the mapping their clients made
    and checked at connect, so that the load only copies; a byte flipped in rank 0's memory
    is caught by its trainer (at connect, then again as it copies that block), which loads
    again, and that block comes from disk."""

    def test_Restart_CheckedByTheTrainer_FlippedByteReadFromDisk(self):
        mib = 1 << 20
        run_ranks("pymem", 2, "memsave")
        for report in run_ranks("pymem", 2, "memload"):
            sources = report["sources"]
            self.assertTrue(report["equal"], report)
            self.assertEqual(report["step"], 10)
            self.assertEqual(sources["bytes_from_memory"], mib, report)
            self.assertEqual(sources["bytes_verified_by_client"], mib, report)
            self.assertEqual(sources["bytes_from_disk"], 0, report)
            self.assertEqual(sources["memory_blocks_rejected"], 0, report)
            # Its agent's resident copy was mapped at connect and the load read through it.
            self.assertTrue(report["prefetch_ended"], report)
            self.assertGreaterEqual(report["stats"]["prefetch_bytes"], mib, report)
            self.assertEqual(report["stats"]["prefetch_populated_bytes"],
                             report["stats"]["prefetch_bytes"], report)
            self.assertEqual(report["stats"]["prefetched_loads"], 1, report)
            self.assertEqual(report["stats"]["staging_maps"], 0, report)
            # Its blocks were checked at connect, against the manifest the agent listed them
            # from, and only copied by the load.
            self.assertGreaterEqual(report["stats"]["prefetch_checked_bytes"], mib, report)
            self.assertEqual(report["stats"]["prefetch_mismatched_blocks"], 0, report)
            self.assertEqual(report["stats"]["prefetch_check_error"], "OK", report)
            self.assertEqual(sources["bytes_checked_ahead"], mib, report)
            # The copy out of the mapping is this process's own part of the load.
            self.assertGreater(sources["copy_seconds"], 0.0, report)

        marker = b"".join(struct.pack("<q", k * 7919) for k in range(16))
        flip_resident_byte("pymem", 0, marker, past=4096)
        rank0, rank1 = run_ranks("pymem", 2, "memload")
        self.assertTrue(rank0["equal"], rank0)
        self.assertEqual(rank0["sources"]["memory_blocks_rejected"], 1, rank0)
        self.assertEqual(rank0["sources"]["bytes_from_disk"], mib, rank0)
        self.assertEqual(rank0["sources"]["bytes_verified_by_client"], 0, rank0)  # the agent's
        self.assertTrue(rank1["equal"], rank1)
        self.assertEqual(rank1["sources"]["bytes_verified_by_client"], mib, rank1)
        self.assertEqual(rank1["sources"]["memory_blocks_rejected"], 0, rank1)
        # Rank 0's check failed on the mapping made at connect; the agent's verified load that
        # followed came in a load region of its own.
        self.assertEqual(rank0["stats"]["prefetched_loads"], 1, rank0)
        self.assertEqual(rank0["stats"]["staging_maps"], 1, rank0)
        self.assertEqual(rank1["stats"]["prefetched_loads"], 1, rank1)
        # Found at connect already: that block was not taken as checked, the rest were.
        self.assertEqual(rank0["stats"]["prefetch_mismatched_blocks"], 1, rank0)
        self.assertEqual(rank0["sources"]["bytes_checked_ahead"], 0, rank0)  # the agent's
        self.assertEqual(rank1["stats"]["prefetch_mismatched_blocks"], 0, rank1)
        self.assertEqual(rank1["sources"]["bytes_checked_ahead"], mib, rank1)


if __name__ == "__main__":
    testlib.main()
