#!/usr/bin/env python3
"""Counts test cases from Bazel's test.xml reports and prints 'N passed, N failed, N skipped'.

Each Bazel test writes bazel-testlogs/<package>/<target>/test.xml (a sharded one, test.xml in
each shard_K_of_N/ below it): GoogleTest's own report (one <testcase> per TEST) or, for other
test kinds, Bazel's one-case report. Only the targets named
on the command line are read, so reports of deleted tests never count. A target with no usable
report (did not build, crashed, timed out) counts as one failure.
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET


def count_report(path):
    """Returns (passed, failed, skipped, names of failed cases) for one test.xml."""
    passed = failed = skipped = 0
    names = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = "%s.%s" % (case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            names.append(name)
        elif (case.find("skipped") is not None or case.get("status") == "notrun"
              or case.get("result") == "skipped"):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, names


_SHARD_DIR = re.compile(r"shard_[0-9]+_of_[0-9]+")


def target_dir(testlogs, label):
    package, _, name = label.lstrip("/").partition(":")
    return os.path.join(testlogs, package, name)


def report_dirs(d):
    """The directories holding a target's test.xml and test.log: its shards' if it is
    sharded, else its own. Only shard_K_of_N: a shard_K_of_N_run_R_of_M directory is left by
    an earlier `bazel test --runs_per_test`, not by this run."""
    try:
        shards = sorted(e for e in os.listdir(d) if _SHARD_DIR.fullmatch(e))
    except OSError:
        shards = []
    return [os.path.join(d, s) for s in shards] if shards else [d]


def count_target(d, label):
    """(passed, failed, skipped, names of failed cases) over a target's reports."""
    passed = failed = skipped = 0
    names = []
    for rd in report_dirs(d):
        try:
            p, f, s, n = count_report(os.path.join(rd, "test.xml"))
        except (OSError, ET.ParseError):
            p, f, s, n = 0, 1, 0, [label + " (no test report: build failure or crash)"]
        # A crash after all cases passed leaves a clean XML; Bazel's log knows better.
        if f == 0 and os.path.exists(os.path.join(rd, "test.log")):
            with open(os.path.join(rd, "test.log"), errors="replace") as fh:
                tail = fh.read()[-2000:]
            if "exited with error code" in tail or "Terminated" in tail:
                f, n = 1, [label + " (process failed after its test cases)"]
        passed, failed, skipped = passed + p, failed + f, skipped + s
        names += n
    if failed == 0 and passed + skipped == 0:
        failed, names = 1, [label + " (ran no test case)"]
    return passed, failed, skipped, names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testlogs", required=True, help="output of `bazel info bazel-testlogs`")
    ap.add_argument("--targets", nargs="*", default=[], help="test labels that were run")
    ap.add_argument("--skipped-targets", nargs="*", default=[],
                    help="test labels not run here (e.g. gpu-tagged without a GPU)")
    ap.add_argument("--bazel-status", type=int, default=0,
                    help="exit status of `bazel test` (0 ok, 3 tests failed, else broken)")
    # The fuzz tier (tests/fuzz) runs in a second `bazel test --config=fuzz`, whose reports
    # are under its own testlogs directory.
    ap.add_argument("--fuzz-testlogs", help="`bazel info --config=fuzz bazel-testlogs`")
    ap.add_argument("--fuzz-targets", nargs="*", default=[], help="fuzz test labels run")
    ap.add_argument("--fuzz-bazel-status", type=int, default=0,
                    help="exit status of the fuzz tier's `bazel test`")
    ap.add_argument("--skipped-fuzz-targets", nargs="*", default=[],
                    help="fuzz test labels not run here (no clang with libFuzzer)")
    args = ap.parse_args()

    passed = failed = skipped = 0
    failures = []
    invocations = [(args.testlogs, args.targets, args.bazel_status, "bazel test")]
    if args.fuzz_targets:
        invocations.append((args.fuzz_testlogs, args.fuzz_targets, args.fuzz_bazel_status,
                            "bazel test --config=fuzz"))
    for testlogs, targets, status, command in invocations:
        failed_before = len(failures)
        for label in targets:
            p, f, s, names = count_target(target_dir(testlogs, label), label)
            passed, failed, skipped = passed + p, failed + f, skipped + s
            failures += names
        if status not in (0, 3) and len(failures) == failed_before:
            # A build that failed can leave an earlier run's reports behind; never call it a
            # pass.
            failed += 1
            failures.append("%s exited with status %d" % (command, status))
    if args.skipped_targets:
        print("skipped (need a GPU): " + " ".join(args.skipped_targets))
        skipped += len(args.skipped_targets)
    if args.skipped_fuzz_targets:
        print("skipped (need clang with libFuzzer): " + " ".join(args.skipped_fuzz_targets))
        skipped += len(args.skipped_fuzz_targets)
    for name in failures:
        print("FAILED: " + name)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
