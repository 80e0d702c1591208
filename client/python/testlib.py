"""Runs a unittest module and writes one JUnit <testcase> per test method into
$XML_OUTPUT_FILE (Bazel's test report), so tests/run.sh counts Python cases individually
(a skipped case is counted skipped, never passed).

Exits non-zero if any case failed or errored, if no case ran, or if a case skipped without
saying why (an empty reason): a suite whose every case skipped passes only when each skip
names its reason, which is printed."""

import os
import sys
import time
import unittest
import xml.etree.ElementTree as ET


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []  # (test, seconds, outcome, text)
        self._start = 0.0

    def startTest(self, test):
        self._start = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, text=""):
        self.cases.append((test, time.monotonic() - self._start, outcome, text))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failure", "unexpected success")


def _write_xml(path, suite_name, cases):
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(cases)),
                          failures=str(sum(c[2] == "failure" for c in cases)),
                          errors=str(sum(c[2] == "error" for c in cases)),
                          skipped=str(sum(c[2] == "skipped" for c in cases)))
    for test, seconds, outcome, text in cases:
        cls = type(test)
        case = ET.SubElement(suite, "testcase", classname="%s.%s" % (cls.__module__, cls.__name__),
                             name=getattr(test, "_testMethodName", str(test)),
                             time="%.3f" % seconds)
        if outcome in ("failure", "error"):
            ET.SubElement(case, outcome, message=text.strip().splitlines()[-1][:200]).text = text
        elif outcome == "skipped":
            ET.SubElement(case, "skipped", message=text)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def unexplained_skips(cases):
    """The ids of the skipped cases whose reason is empty."""
    return [test.id() for test, _, outcome, text in cases
            if outcome == "skipped" and not text.strip()]


def main(module_name="__main__"):
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[module_name])
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Result)
    result = runner.run(suite)
    xml_path = os.environ.get("XML_OUTPUT_FILE")
    if xml_path:
        _write_xml(xml_path, os.path.basename(sys.argv[0]), result.cases)
    ok = result.wasSuccessful() and result.testsRun > 0
    if result.testsRun == 0:
        print("FAIL: no test ran", file=sys.stderr)
    unexplained = unexplained_skips(result.cases)
    if unexplained:
        ok = False
        print("FAIL: skipped without saying why: " + ", ".join(unexplained), file=sys.stderr)
    skipped = [(test.id(), text) for test, _, outcome, text in result.cases
               if outcome == "skipped"]
    if skipped and len(skipped) == result.testsRun:
        print("every test skipped:", file=sys.stderr)
        for name, why in skipped:
            print("  %s: %s" % (name, why or "(no reason)"), file=sys.stderr)
    sys.exit(0 if ok else 1)
