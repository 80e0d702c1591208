"""tests/summarize.py's counts: sharded targets, missing reports, targets that ran nothing."""

import os
import subprocess
import sys
import tempfile
import unittest

import testlib

_SUMMARIZE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "summarize.py")


def report(cases):
    """A JUnit report of `cases`: (name, outcome) with outcome pass, failure or skipped."""
    body = []
    for name, outcome in cases:
        inner = {"pass": "", "failure": "<failure message='x'/>",
                 "skipped": "<skipped message='why'/>"}[outcome]
        body.append("<testcase classname='C' name='%s'>%s</testcase>" % (name, inner))
    return "<testsuites><testsuite>%s</testsuite></testsuites>" % "".join(body)


class Summarize(unittest.TestCase):
    def setUp(self):
        self.logs = tempfile.mkdtemp()

    def write(self, rel, text):
        path = os.path.join(self.logs, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def run_summarize(self, *targets):
        proc = subprocess.run([sys.executable, _SUMMARIZE, "--testlogs", self.logs,
                               "--targets", *targets], capture_output=True, text=True)
        return proc.returncode, proc.stdout.strip().splitlines()

    def test_sharded_target_counts_every_shard(self):
        self.write("p/t/shard_1_of_2/test.xml", report([("a", "pass"), ("b", "skipped")]))
        self.write("p/t/shard_2_of_2/test.xml", report([("c", "pass")]))
        rc, lines = self.run_summarize("//p:t")
        self.assertEqual(rc, 0)
        self.assertEqual(lines[-1], "2 passed, 0 failed, 1 skipped")

    def test_runs_of_an_earlier_invocation_not_counted(self):
        # `bazel test --runs_per_test=2` leaves shard_K_of_N_run_R_of_2 beside the shards that
        # ./tests/run.sh's own invocation writes; only the latter are this run's.
        self.write("p/t/shard_1_of_2/test.xml", report([("a", "pass")]))
        self.write("p/t/shard_2_of_2/test.xml", report([("c", "pass")]))
        self.write("p/t/shard_1_of_2_run_1_of_2/test.xml", report([("a", "failure")]))
        self.write("p/t/shard_2_of_2_run_2_of_2/test.xml", report([("c", "pass")]))
        rc, lines = self.run_summarize("//p:t")
        self.assertEqual((rc, lines[-1]), (0, "2 passed, 0 failed, 0 skipped"))

    def test_shard_without_report_is_a_failure(self):
        self.write("p/t/shard_1_of_2/test.xml", report([("a", "pass")]))
        self.write("p/t/shard_2_of_2/test.log", "killed\n")
        rc, lines = self.run_summarize("//p:t")
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: //p:t (no test report: build failure or crash)", lines)
        self.assertEqual(lines[-1], "1 passed, 1 failed, 0 skipped")

    def test_shard_that_ran_no_case_is_fine_when_another_did(self):
        self.write("p/t/shard_1_of_2/test.xml", report([("a", "pass")]))
        self.write("p/t/shard_2_of_2/test.xml", report([]))
        rc, lines = self.run_summarize("//p:t")
        self.assertEqual((rc, lines[-1]), (0, "1 passed, 0 failed, 0 skipped"))

    def test_target_that_ran_no_case_fails(self):
        self.write("p/t/test.xml", report([]))
        rc, lines = self.run_summarize("//p:t")
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: //p:t (ran no test case)", lines)

    def test_unsharded_failure_named(self):
        self.write("p/t/test.xml", report([("a", "failure"), ("b", "pass")]))
        rc, lines = self.run_summarize("//p:t")
        self.assertEqual(rc, 1)
        self.assertIn("FAILED: C.a", lines)
        self.assertEqual(lines[-1], "1 passed, 1 failed, 0 skipped")


    def test_fuzz_tier_counted_from_its_own_testlogs(self):
        fuzz_logs = tempfile.mkdtemp()
        path = os.path.join(fuzz_logs, "tests/fuzz/a_fuzz_test/test.xml")
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as f:
            f.write(report([("a_fuzz_test", "pass")]))
        self.write("p/t/test.xml", report([("a", "pass")]))
        proc = subprocess.run([sys.executable, _SUMMARIZE, "--testlogs", self.logs,
                               "--targets", "//p:t", "--fuzz-testlogs", fuzz_logs,
                               "--fuzz-targets", "//tests/fuzz:a_fuzz_test",
                               "//tests/fuzz:b_fuzz_test", "--fuzz-bazel-status", "3"],
                              capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        self.assertEqual((proc.returncode, lines[-1]), (1, "2 passed, 1 failed, 0 skipped"))
        self.assertIn("FAILED: //tests/fuzz:b_fuzz_test (no test report: build failure or crash)",
                      lines)

    def test_fuzz_tier_without_clang_skipped_saying_why(self):
        self.write("p/t/test.xml", report([("a", "pass")]))
        proc = subprocess.run([sys.executable, _SUMMARIZE, "--testlogs", self.logs,
                               "--targets", "//p:t", "--skipped-fuzz-targets",
                               "//tests/fuzz:a_fuzz_test"], capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        self.assertEqual((proc.returncode, lines[-1]), (0, "1 passed, 0 failed, 1 skipped"))
        self.assertIn("skipped (need clang with libFuzzer): //tests/fuzz:a_fuzz_test", lines)


if __name__ == "__main__":
    testlib.main()
