"""testlib's verdicts on whole suites: run small unittest modules through testlib.main in a
child process and check the exit status and the JUnit report it writes."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
import xml.etree.ElementTree as ET

import testlib

_HERE = os.path.dirname(os.path.abspath(testlib.__file__))


def run_suite(body):
    """Runs a module made of `body` under testlib.main; returns (exit status, stderr,
    {case name: outcome})."""
    with tempfile.TemporaryDirectory() as tmp:
        module = os.path.join(tmp, "suite.py")
        with open(module, "w") as f:
            f.write("import unittest\nimport testlib\n")
            f.write(textwrap.dedent(body))
            f.write("\nif __name__ == '__main__':\n    testlib.main()\n")
        xml_path = os.path.join(tmp, "report.xml")
        env = dict(os.environ, XML_OUTPUT_FILE=xml_path, PYTHONPATH=_HERE)
        proc = subprocess.run([sys.executable, module], env=env, capture_output=True,
                              text=True, timeout=60)
        outcomes = {}
        if os.path.exists(xml_path):
            for case in ET.parse(xml_path).getroot().iter("testcase"):
                kinds = [child.tag for child in case]
                outcomes[case.get("name")] = kinds[0] if kinds else "passed"
        return proc.returncode, proc.stderr, outcomes


class SuiteVerdicts(unittest.TestCase):
    def test_every_case_skipped_with_reasons_passes_and_reports_skips(self):
        rc, err, outcomes = run_suite('''
            class T(unittest.TestCase):
                @unittest.skip("needs a GPU")
                def test_a(self): pass
                @unittest.skip("needs two hosts")
                def test_b(self): pass
            ''')
        self.assertEqual(rc, 0, err)
        self.assertEqual(outcomes, {"test_a": "skipped", "test_b": "skipped"})
        self.assertIn("every test skipped", err)
        self.assertIn("needs a GPU", err)

    def test_every_case_skipped_without_a_reason_fails(self):
        rc, err, outcomes = run_suite('''
            class T(unittest.TestCase):
                @unittest.skip("")
                def test_a(self): pass
                def test_b(self): self.skipTest("  ")
            ''')
        self.assertEqual(rc, 1)
        self.assertIn("skipped without saying why", err)
        self.assertIn("test_a", err)
        self.assertEqual(outcomes, {"test_a": "skipped", "test_b": "skipped"})

    def test_one_unexplained_skip_beside_passes_fails(self):
        rc, err, _ = run_suite('''
            class T(unittest.TestCase):
                def test_a(self): pass
                @unittest.skip("")
                def test_b(self): pass
            ''')
        self.assertEqual(rc, 1)
        self.assertIn("T.test_b", err)

    def test_no_case_fails(self):
        rc, err, outcomes = run_suite("x = 1\n")
        self.assertEqual(rc, 1)
        self.assertIn("no test ran", err)
        self.assertEqual(outcomes, {})

    def test_passes_and_explained_skips_pass(self):
        rc, err, outcomes = run_suite('''
            class T(unittest.TestCase):
                def test_a(self): pass
                @unittest.skip("needs CUDA")
                def test_b(self): pass
            ''')
        self.assertEqual(rc, 0, err)
        self.assertEqual(outcomes, {"test_a": "passed", "test_b": "skipped"})
        self.assertNotIn("every test skipped", err)

    def test_a_failure_fails(self):
        rc, _, outcomes = run_suite('''
            class T(unittest.TestCase):
                def test_a(self): self.assertEqual(1, 2)
            ''')
        self.assertEqual(rc, 1)
        self.assertEqual(outcomes, {"test_a": "failure"})


if __name__ == "__main__":
    testlib.main()
