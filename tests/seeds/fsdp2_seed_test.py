"""Assertions of fsdp2_per_parameter_shards_test.sh on the output of its runs
(fsdp2_rank.py; $TESSERA_SEED_DIR/logs/<run>-<rank>.out and <run>.rc):

* fsdpref: dp_shard=4, uninterrupted, 6 steps — the reference of the FSDP runs;
* fsdp-killed / fsdp-resumed: all 4 ranks SIGKILLed at the start of step 5, resumed from
  `latest` (step 4) on dp_shard=2;
* tpref: dp_shard=2 x tp=2 (FSDP x TP), uninterrupted — the reference of the 2-D runs;
* tp-killed / tp-resumed: the same on 2 x 2, resumed on dp_shard=1 x tp=2;
* tpref-load-fsdp: tpref's step 6 loaded on dp_shard=2 (FSDP only);
* tpref-load-plain: tpref's step 6 loaded by one process into a plain model; its data files
  opened with safetensors; its consolidated export loaded with safetensors.torch.load_file.

Losses are compared as float.hex strings: exact bits, no tolerance.
"""

import os
import re
import subprocess
import sys
import unittest

import testlib

RUN_DIR = os.environ.get("TESSERA_SEED_DIR", "")
STEPS = 6
TESSERA_CLI = os.path.join(os.getcwd(), "client", "cli", "tessera")


class Run:
    """One run's output per rank: losses {step: hex}, commits, resume point, final digest,
    exit status, and the shard lines."""

    def __init__(self, name):
        self.name = name
        self.ranks = []
        with open(os.path.join(RUN_DIR, "logs", name + ".rc")) as f:
            for line in f:
                rank, rc, how = line.split()
                self.ranks.append(self._parse(int(rank), int(rc), how))

    def _parse(self, rank, rc, how):
        with open(os.path.join(RUN_DIR, "logs", "%s-%d.out" % (self.name, rank)),
                  errors="replace") as f:
            text = f.read()
        out = {"rank": rank, "rc": rc, "how": how, "text": text, "losses": {}, "committed": [],
               "resumed": None, "saved_by": None, "final": None, "empty": [], "strided": [],
               "ok": []}
        for line in text.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] == "loss":
                out["losses"][int(words[1])] = words[2]
            elif words[:1] == ["committed"]:
                out["committed"].append(int(words[1]))
            elif line.startswith("resumed from step"):
                m = re.match(r"resumed from step (\d+) saved by (\d+)", line)
                out["resumed"], out["saved_by"] = int(m.group(1)), int(m.group(2))
            elif words[:1] == ["final"]:
                out["final"] = words[2]
            elif line.startswith("empty shards:"):
                out["empty"] = [w for w in line.split(":", 1)[1].strip().split(",") if w]
            elif line.startswith("strided shards:"):
                out["strided"] = [w for w in line.split(":", 1)[1].strip().split(",") if w]
            elif line.startswith("ok: "):
                out["ok"].append(line)
        return out

    def tail(self, rank):
        r = self.ranks[rank]
        return "\n--- %s rank %d (exit %d, %s) ---\n%s" % (self.name, rank, r["rc"], r["how"],
                                                          r["text"][-3000:])

    def assert_clean(self, test, world):
        test.assertEqual(len(self.ranks), world, self.name)
        for r in self.ranks:
            test.assertEqual((r["rc"], r["how"]), (0, "exited"), self.tail(r["rank"]))


def report(what, ref, steps):
    sys.stderr.write("parity: %s: steps %d..%d bitwise identical to the uninterrupted run; "
                     "step %d loss %s\n" % (what, steps[0], steps[-1], steps[-1], ref[steps[-1]]))


class KillAndResume:
    """Checks shared by the FSDP and the FSDP x TP scenario."""

    ref_run = killed_run = resumed_run = ""
    world = resumed_world = 0

    def reference(self):
        return Run(self.ref_run).ranks[0]["losses"]

    def test_Reference_Uninterrupted_EveryRankSameLossesAndCommits(self):
        run = Run(self.ref_run)
        run.assert_clean(self, self.world)
        for r in run.ranks:
            self.assertEqual(sorted(r["losses"]), list(range(1, STEPS + 1)), run.tail(r["rank"]))
            self.assertEqual(r["losses"], run.ranks[0]["losses"])
            self.assertEqual(r["committed"], [2, 4, 6])
            self.assertEqual(r["final"], run.ranks[0]["final"])
        losses = [float.fromhex(h) for _, h in sorted(run.ranks[0]["losses"].items())]
        self.assertEqual(len(set(losses)), len(losses), losses)  # it trains: no constant run

    def test_KillAll_RanksKilledAfterCommittingStep4(self):
        ref = self.reference()
        run = Run(self.killed_run)
        self.assertEqual(len(run.ranks), self.world)
        for r in run.ranks:
            self.assertEqual(r["committed"], [2, 4], run.tail(r["rank"]))
            self.assertIn("hanging at step 5", r["text"], run.tail(r["rank"]))
            self.assertEqual((r["rc"], r["how"]), (137, "exited"), run.tail(r["rank"]))  # SIGKILL
            self.assertEqual(r["losses"], {s: ref[s] for s in range(1, 5)})

    def test_Resume_OtherMesh_LossesBitwiseIdentical(self):
        ref = self.reference()
        run = Run(self.resumed_run)
        run.assert_clean(self, self.resumed_world)
        for r in run.ranks:
            self.assertEqual((r["resumed"], r["saved_by"]), (4, self.world), run.tail(r["rank"]))
            self.assertEqual(r["losses"], {s: ref[s] for s in range(5, STEPS + 1)},
                             "rank %d diverged from the uninterrupted run" % r["rank"])
            self.assertEqual(r["committed"], [6])
        report("%s resumed on %d ranks" % (self.killed_run, self.resumed_world), ref,
               list(range(5, STEPS + 1)))

    def test_Resume_OtherMesh_FinalStateBitwiseIdentical(self):
        final = Run(self.ref_run).ranks[0]["final"]
        for r in Run(self.resumed_run).ranks:
            self.assertEqual(r["final"], final)


@unittest.skipUnless(RUN_DIR, "needs the runs of fsdp2_per_parameter_shards_test.sh")
class Fsdp4To2Test(KillAndResume, unittest.TestCase):
    ref_run, killed_run, resumed_run = "fsdpref", "fsdp-killed", "fsdp-resumed"
    world, resumed_world = 4, 2

    def test_Fsdp4_UnevenAndEmptyShards_AsTorchCutsThem(self):
        run = Run(self.ref_run)
        # 13 vocabulary rows as 4, 4, 4, 1 leave nothing empty; each block's [1] gate lives on
        # rank 0 only.
        self.assertEqual(run.ranks[0]["empty"], [])
        for r in run.ranks[1:]:
            self.assertEqual(r["empty"], ["layers.0.gate", "layers.1.gate"], run.tail(r["rank"]))
        self.assertEqual(run.ranks[0]["strided"], [])


@unittest.skipUnless(RUN_DIR, "needs the runs of fsdp2_per_parameter_shards_test.sh")
class FsdpTimesTpTest(KillAndResume, unittest.TestCase):
    ref_run, killed_run, resumed_run = "tpref", "tp-killed", "tp-resumed"
    world, resumed_world = 4, 2

    def test_FsdpTimesTp_StridedShardsOfColumnParallelWeights(self):
        strided = Run(self.ref_run).ranks[0]["strided"]
        for fqn in ("layers.0.attention.wq.weight", "layers.1.feed_forward.w1.weight",
                    "tok_embeddings.weight"):
            self.assertIn(fqn, strided)
        self.assertNotIn("layers.0.attention.wo.weight", strided)  # Shard(0), Shard(1)

    def test_LoadFsdpTimesTpCheckpoint_OnFsdpOnly_BitwiseIdentical(self):
        run = Run("tpref-load-fsdp")
        run.assert_clean(self, 2)
        for r in run.ranks:
            self.assertEqual(len(r["ok"]), 1, run.tail(r["rank"]))
            self.assertRegex(r["ok"][0], r"^ok: rank \d loaded step 6 on dp_shard=2 "
                                         r"\(placements .*Shard\(dim=0\).*\): \d+ tensors bitwise")
            self.assertNotIn("_StridedShard", r["ok"][0])

    def test_LoadFsdpTimesTpCheckpoint_OnePlainProcess_DataFilesAndExport(self):
        run = Run("tpref-load-plain")
        run.assert_clean(self, 1)
        ok = run.ranks[0]["ok"]
        self.assertEqual(len(ok), 3, run.tail(0))
        self.assertRegex(ok[0], r"^ok: one process loaded step 6 into a plain model and AdamW: "
                                r"\d+ tensors bitwise identical")
        self.assertRegex(ok[1], r"^ok: [1-9]\d* data files opened with safetensors [\d.]+: "
                                r"\d+ chunks hold the saved bytes")
        self.assertIn("load_state_dict(strict=True)", ok[2])


@unittest.skipUnless(RUN_DIR, "needs the runs of fsdp2_per_parameter_shards_test.sh")
class CheckpointsVerifyTest(unittest.TestCase):
    def test_Checkpoints_EveryCommittedStep_Verifies(self):
        for job in ("fsdpref", "fsdp", "tpref", "tp"):
            for step in (2, 4, 6):
                path = os.path.join(RUN_DIR, "ckpt", job, "step-%09d" % step)
                proc = subprocess.run([TESSERA_CLI, "verify", path], capture_output=True,
                                      text=True, timeout=60)
                self.assertEqual(proc.returncode, 0, "%s: %s%s" % (path, proc.stdout, proc.stderr))
                self.assertTrue(proc.stdout.startswith("OK: "), proc.stdout)


if __name__ == "__main__":
    testlib.main()
