"""Assertions of pp_half_saved_test.sh on the JSON line each pipeline stage printed
(pp_side_by_side_rank.py; $TESSERA_SEED_DIR/logs/stages-<rank>.out and stages.rc).

Two stages name their blocks alike (layers.0, layers.1):
* DCP of torch 2.11 saves without complaint, keeps one copy of every such name — some from
  one stage, some from the other — and loads without complaint: for every block tensor (and
  its optimizer state), one stage gets back its own values and the other gets the first
  stage's. Half of the block tensors the stages held are in no file of the checkpoint (the
  step counts, equal on both stages, come back as saved).
* tessera refuses the save: save() raises DUPLICATE_FQN naming a block and both stages'
  mesh coordinates; nothing is written, `latest` stays unset.
With stage-unique names (the control) DCP reloads every tensor as saved and tessera commits.
"""

import json
import os
import subprocess
import unittest

import testlib

RUN_DIR = os.environ.get("TESSERA_SEED_DIR", "")
TESSERA_CLI = os.path.join(os.getcwd(), "client", "cli", "tessera")


def reports():
    out = []
    with open(os.path.join(RUN_DIR, "logs", "stages.rc")) as f:
        for line in f:
            rank, rc, how = line.split()
            path = os.path.join(RUN_DIR, "logs", "stages-%s.out" % rank)
            with open(path, errors="replace") as g:
                text = g.read()
            if (rc, how) != ("0", "exited"):
                raise AssertionError("stage %s exited %s (%s):\n%s" % (rank, rc, how, text[-3000:]))
            out.append(json.loads(text.strip().splitlines()[-1]))
    return sorted(out, key=lambda r: r["rank"])


def is_block(key):
    return ".layers." in key


@unittest.skipUnless(RUN_DIR, "needs the run of pp_half_saved_test.sh")
class DcpReusedNamesTest(unittest.TestCase):
    def test_Dcp_ReusedNames_SaveAndLoadReportSuccess(self):
        for r in reports():
            self.assertEqual(r["dcp"]["reused"]["save"], "Metadata", r["rank"])
            self.assertIsNone(r["dcp"]["reused"]["load_error"], r["rank"])

    def test_Dcp_ReusedNames_HalfTheBlockTensorsReplacedByTheOtherStages(self):
        stages = reports()
        got = [s["dcp"]["reused"]["tensors"] for s in stages]
        blocks = sorted(k for k in got[0] if is_block(k))
        self.assertEqual(blocks, sorted(k for k in got[1] if is_block(k)))  # the same names
        self.assertTrue(any(k.startswith("model.") for k in blocks))
        self.assertTrue(any(k.startswith("optim.") for k in blocks))
        # The blocks' weights and moments differ between the stages; their step counts are
        # equal (both stages stepped twice) and come back as saved.
        differing = [k for k in blocks if got[0][k] != "same"]
        self.assertEqual(sorted(k for k in blocks if k not in differing),
                         sorted(k for k in blocks if k.endswith(".step")))
        for key in differing:
            # One stage's copy survived under the name; the other stage loads it.
            self.assertEqual(sorted([got[0][key], got[1][key]]), ["other", "own"], key)
        lost = sum(g[k] == "other" for g in got for k in differing)
        self.assertEqual(lost, len(differing))  # half of the 2 x len(differing) tensors held
        for g in got:  # what only one stage has (embedding, norm, output) is intact
            self.assertEqual({v for k, v in g.items() if not is_block(k)}, {"own"})

    def test_Dcp_StageUniqueNames_EveryTensorReloadedAsSaved(self):
        for r in reports():
            unique = r["dcp"]["unique"]
            self.assertEqual((unique["save"], unique["load_error"]), ("Metadata", None))
            self.assertEqual(set(unique["tensors"].values()), {"own"}, unique["tensors"])
            self.assertTrue(any(".layers." in k for k in unique["tensors"]))


@unittest.skipUnless(RUN_DIR, "needs the run of pp_half_saved_test.sh")
class TesseraReusedNamesTest(unittest.TestCase):
    def test_Tessera_ReusedNames_DuplicateFqnFromSaveNamingBothStages(self):
        for r in reports():
            t = r["tessera"]["reused"]
            self.assertEqual((t["raised_by"], t["error"], t["code"]),
                             ("save", "InvalidArgumentError", "DUPLICATE_FQN"), t)
            self.assertRegex(t["message"], r"layers\.[01]\.")
            self.assertEqual(sorted(rank for rank, _ in t["ranks"]), [0, 1], t)
            self.assertEqual(sorted(str(c) for _, c in t["ranks"]), ["pp=0", "pp=1"], t)
            self.assertEqual((t["latest_before"], t["latest_after"]), (None, None))

    def test_Tessera_ReusedNames_NothingWritten(self):
        # save() raised at planning, before any copy: no directory of step 1, final or partial.
        job_dir = os.path.join(RUN_DIR, "ckpt", "pphalf")
        entries = os.listdir(job_dir) if os.path.isdir(job_dir) else []
        self.assertEqual([e for e in entries if e.startswith("step-000000001")], [], entries)

    def test_Tessera_StageUniqueNames_CommitsEveryBlock(self):
        stages = reports()
        for r in stages:
            self.assertIn("committed", r["tessera"]["unique"], r["tessera"]["unique"])
        path = stages[0]["tessera"]["unique"]["committed"]
        proc = subprocess.run([TESSERA_CLI, "inspect", "--json", path], capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        keys = {t["key"] for t in json.loads(proc.stdout)["tensors"]}
        for layer in range(4):
            self.assertIn("layers.%d.w1.weight" % layer, keys)
            self.assertIn("layers.%d.w1.weight#exp_avg" % layer, keys)
        verify = subprocess.run([TESSERA_CLI, "verify", path], capture_output=True, text=True,
                                timeout=60)
        self.assertTrue(verify.stdout.startswith("OK: "), verify.stdout + verify.stderr)


if __name__ == "__main__":
    testlib.main()
