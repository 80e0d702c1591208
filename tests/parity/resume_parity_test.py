"""Assertions of resume_parity_test.sh, on the output of the trainer runs it made
(parity_trainer.py; $TESSERA_PARITY_DIR/logs/<run>-<rank>.out and <run>.rc):

* ref: 4 ranks, uninterrupted, $TESSERA_PARITY_STEPS steps — the reference losses;
* same-killed / same-resumed: all 4 trainers SIGKILLed at the start of step 8, resumed from
  `latest` (step 5) on 4 ranks;
* newdp-killed / newdp-resumed: rank 2 SIGKILLed at the start of step 13, resumed from `latest`
  (step 10) on 2 ranks by new agents (layout dp=2).

Losses are compared as float.hex strings: exact bits, no tolerance.
"""

import os
import re
import subprocess
import sys
import unittest

import testlib

RUN_DIR = os.environ.get("TESSERA_PARITY_DIR", "")
STEPS = int(os.environ.get("TESSERA_PARITY_STEPS", "20"))
SAVE_EVERY = 5
TESSERA_CLI = os.path.join(os.getcwd(), "client", "cli", "tessera")


class Run:
    """The parsed output of one run: per rank its losses {step: hex}, commits, resume point,
    final digest, exit status and whether the harness had to kill it."""

    def __init__(self, name):
        self.name = name
        self.ranks = []
        with open(os.path.join(RUN_DIR, "logs", name + ".rc")) as f:
            for line in f:
                rank, rc, how = line.split()
                self.ranks.append(self._parse(int(rank), int(rc), how))

    def _parse(self, rank, rc, how):
        path = os.path.join(RUN_DIR, "logs", "%s-%d.out" % (self.name, rank))
        with open(path, errors="replace") as f:
            text = f.read()
        out = {"rank": rank, "rc": rc, "how": how, "text": text, "losses": {}, "committed": [],
               "resumed": None, "saved_by": None, "final": None, "fresh": False}
        for line in text.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] == "loss":
                out["losses"][int(words[1])] = words[2]
            elif words[:1] == ["committed"]:
                out["committed"].append(int(words[1]))
            elif line.startswith("resumed from step"):
                m = re.match(r"resumed from step (\d+) saved by (\d+) ranks", line)
                out["resumed"], out["saved_by"] = int(m.group(1)), int(m.group(2))
            elif words[:1] == ["final"]:
                out["final"] = words[2]
            elif line == "fresh start":
                out["fresh"] = True
        return out

    def tail(self, rank):
        return "\n--- %s rank %d (exit %d, %s) ---\n%s" % (
            self.name, rank, self.ranks[rank]["rc"], self.ranks[rank]["how"],
            self.ranks[rank]["text"][-3000:])


def reference():
    return Run("ref").ranks[0]["losses"]


def report(what, steps):
    """One line in the test log saying what was compared (exact float bits)."""
    ref = reference()
    sys.stderr.write("parity: %s: steps %d..%d (%d losses) bitwise identical to the "
                     "uninterrupted run; step %d loss %s\n"
                     % (what, steps[0], steps[-1], len(steps), steps[-1], ref[steps[-1]]))


@unittest.skipUnless(RUN_DIR, "needs the runs of resume_parity_test.sh")
class ReferenceRunTest(unittest.TestCase):
    def test_Reference_Dp4Uninterrupted_EveryRankLogsEveryStepAndCommit(self):
        run = Run("ref")
        self.assertEqual(len(run.ranks), 4)
        for r in run.ranks:
            self.assertEqual((r["rc"], r["how"]), (0, "exited"), run.tail(r["rank"]))
            self.assertTrue(r["fresh"], run.tail(r["rank"]))
            self.assertEqual(sorted(r["losses"]), list(range(1, STEPS + 1)))
            self.assertEqual(r["committed"], list(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY)))
            # Every rank holds the same all-gathered loss.
            self.assertEqual(r["losses"], run.ranks[0]["losses"])
            self.assertEqual(r["final"], run.ranks[0]["final"])
        # The run trains: not a constant sequence (which any resume would trivially match).
        losses = [float.fromhex(h) for _, h in sorted(run.ranks[0]["losses"].items())]
        self.assertEqual(len(set(losses)), len(losses), losses)
        self.assertLess(min(losses[-5:]), losses[0])


@unittest.skipUnless(RUN_DIR, "needs the runs of resume_parity_test.sh")
class KillAllResumeSameDpTest(unittest.TestCase):
    def test_KillAll_BeforeResume_RanksKilledAfterCommittingStep5(self):
        run = Run("same-killed")
        self.assertEqual(len(run.ranks), 4)
        for r in run.ranks:
            self.assertEqual(r["committed"], [5], run.tail(r["rank"]))
            self.assertIn("hanging at step 8", r["text"], run.tail(r["rank"]))
            self.assertEqual(r["rc"], 137, run.tail(r["rank"]))  # SIGKILL
            self.assertEqual(sorted(r["losses"]), list(range(1, 8)))

    def test_KillAll_ResumeDp4FromLatest_LossesBitwiseIdentical(self):
        ref = reference()
        run = Run("same-resumed")
        self.assertEqual(len(run.ranks), 4)
        for r in run.ranks:
            self.assertEqual((r["rc"], r["how"]), (0, "exited"), run.tail(r["rank"]))
            self.assertEqual((r["resumed"], r["saved_by"]), (5, 4), run.tail(r["rank"]))
            self.assertEqual(sorted(r["losses"]), list(range(6, STEPS + 1)))
            self.assertEqual(r["losses"], {s: ref[s] for s in range(6, STEPS + 1)},
                             "rank %d diverged from the uninterrupted run" % r["rank"])
        report("killed on 4 ranks, resumed on 4", list(range(6, STEPS + 1)))

    def test_KillAll_ResumeDp4_FinalStateBitwiseIdentical(self):
        final = Run("ref").ranks[0]["final"]
        for r in Run("same-resumed").ranks:
            self.assertEqual(r["final"], final)

    def test_KillAll_LossesBeforeKill_MatchReference(self):
        ref = reference()
        for r in Run("same-killed").ranks:
            self.assertEqual(r["losses"], {s: ref[s] for s in range(1, 8)})


@unittest.skipUnless(RUN_DIR, "needs the runs of resume_parity_test.sh")
class KillOneRankResumeOtherDpTest(unittest.TestCase):
    def test_KillOneRank_Peers_FailOnTheirOwn(self):
        run = Run("newdp-killed")
        self.assertEqual(len(run.ranks), 4)
        for r in run.ranks:
            self.assertEqual(r["committed"], [5, 10], run.tail(r["rank"]))
            if r["rank"] == 2:
                self.assertIn("hanging at step 13", r["text"], run.tail(2))
                self.assertEqual(r["rc"], 137, run.tail(2))
            else:
                # The survivors' collective failed: they ended by themselves, with an error.
                self.assertEqual(r["how"], "exited", run.tail(r["rank"]))
                self.assertNotEqual(r["rc"], 0, run.tail(r["rank"]))
                self.assertNotIn(13, r["losses"], run.tail(r["rank"]))

    def test_KillOneRank_ResumeDp2FromLatest_LossesBitwiseIdentical(self):
        ref = reference()
        run = Run("newdp-resumed")
        self.assertEqual(len(run.ranks), 2)
        for r in run.ranks:
            self.assertEqual((r["rc"], r["how"]), (0, "exited"), run.tail(r["rank"]))
            self.assertEqual((r["resumed"], r["saved_by"]), (10, 4), run.tail(r["rank"]))
            self.assertEqual(sorted(r["losses"]), list(range(11, STEPS + 1)))
            self.assertEqual(r["losses"], {s: ref[s] for s in range(11, STEPS + 1)},
                             "rank %d on dp=2 diverged from the dp=4 run" % r["rank"])
            self.assertEqual(r["committed"], [15, 20])
        report("rank 2 killed on 4 ranks, resumed on 2", list(range(11, STEPS + 1)))

    def test_KillOneRank_ResumeDp2_FinalStateBitwiseIdentical(self):
        final = Run("ref").ranks[0]["final"]
        for r in Run("newdp-resumed").ranks:
            self.assertEqual(r["final"], final)


@unittest.skipUnless(RUN_DIR, "needs the runs of resume_parity_test.sh")
class CheckpointsVerifyTest(unittest.TestCase):
    def test_Checkpoints_EveryCommittedStep_Verifies(self):
        expected = {"ref": [5, 10, 15, 20], "same": [5, 10, 15, 20], "newdp": [5, 10, 15, 20]}
        for job, steps in expected.items():
            for step in steps:
                path = os.path.join(RUN_DIR, "ckpt", job, "step-%09d" % step)
                proc = subprocess.run([TESSERA_CLI, "verify", path], capture_output=True,
                                      text=True, timeout=60)
                self.assertEqual(proc.returncode, 0, "%s: %s%s" % (path, proc.stdout,
                                                                 proc.stderr))
                self.assertTrue(proc.stdout.startswith("OK: "), proc.stdout)


if __name__ == "__main__":
    testlib.main()
