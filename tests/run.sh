#!/usr/bin/env bash
# Runs every Tessera test and ends with one line: "N passed, N failed, N skipped".
#
#   ./tests/run.sh            install what is missing, build, run all tests
#   ./tests/run.sh --no-deps  skip the apt-get check (for repeated local runs)
#
# Suites: every Bazel test (C++ unit, in-process gRPC, end-to-end tests that drive real
# processes), counted per test case from their XML reports. Tests tagged "gpu" run only where
# a GPU is visible (nvidia-smi); elsewhere they are counted as skipped. The fuzz tier
# (tests/fuzz, tagged "fuzz") builds with clang and libFuzzer in a second invocation,
# `bazel test --config=fuzz`; where clang or its fuzzer runtime is missing it is counted as
# skipped. Exits non-zero if anything failed or did not build.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != "--no-deps" ]; then
  ./deploy/install-deps.sh || { echo "0 passed, 1 failed"; exit 1; }
fi

start=$(date +%s)
if ! all_tests=$(bazel query 'tests(//...)' | sort); then
  echo "run.sh: bazel query failed (a BUILD file is broken)"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
gpu_tests=$(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null | sort)
tag_filter="-gpu"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  tag_filter=""
  gpu_tests=""
  echo "run.sh: GPU visible; running gpu-tagged tests too"
fi
fuzz_tests=$(bazel query 'attr(tags, "\bfuzz\b", tests(//...))' 2>/dev/null | sort)
run_tests=$(comm -23 <(echo "$all_tests") <(sort <(echo "$gpu_tests") <(echo "$fuzz_tests")) |
  grep . || true)

bazel_status=0
bazel test //... --keep_going --test_tag_filters="$tag_filter" --build_tests_only \
  --test_summary=short || bazel_status=$?
# The fuzz tier: its short runs (a fixed number of executions each, bounded in time).
fuzz_status=0
fuzz_args=()
if [ -n "$fuzz_tests" ]; then
  # clang prints the bare name when it has no such runtime.
  if [ -f "$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ]; then
    bazel test --config=fuzz --keep_going --test_summary=short $fuzz_tests || fuzz_status=$?
    fuzz_args=(--fuzz-testlogs "$(bazel info --config=fuzz bazel-testlogs 2>/dev/null)"
               --fuzz-targets $fuzz_tests --fuzz-bazel-status "$fuzz_status")
  else
    echo "run.sh: no clang with libFuzzer (libclang_rt.fuzzer); the fuzz tier is skipped"
    fuzz_args=(--skipped-fuzz-targets $fuzz_tests)
  fi
fi
/usr/bin/python3 tests/summarize.py --testlogs "$(bazel info bazel-testlogs 2>/dev/null)" \
  --targets $run_tests --skipped-targets $gpu_tests --bazel-status "$bazel_status" \
  "${fuzz_args[@]}"
rc=$?
echo "run.sh: wall time $(( $(date +%s) - start )) s (after the dependency check)" >&2
exit $rc
