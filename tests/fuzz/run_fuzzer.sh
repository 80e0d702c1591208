#!/usr/bin/env bash
# The short run of one fuzz target (tests/fuzz/fuzz.bzl): replays its regression inputs, then
# fuzzes from its seed corpus for a fixed number of executions with a fixed seed, bounded in
# time. A crash fails the test; the input that caused it is kept in the test's outputs
# (bazel-testlogs/.../test.outputs/), to be added under regressions/ with its fix.
#
#   run_fuzzer.sh FUZZER CORPUS_DIR REGRESSIONS_DIR RUNS MAX_TOTAL_TIME
#
# TESSERA_FUZZ_SEED overrides the seed (default 1).
set -euo pipefail
fuzzer=$1 corpus=$2 regressions=$3 runs=$4 max_time=$5
artifacts=${TEST_UNDECLARED_OUTPUTS_DIR:-${TMPDIR:-/tmp}}/
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/corpus.XXXXXX")
[ -d "$corpus" ] || { echo "no seed corpus at $corpus"; exit 1; }
# ASan: report leaks too; UBSan findings abort (the build says -fno-sanitize-recover).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
  echo "replaying $(ls "$regressions" | wc -l) regression inputs"
  "$fuzzer" -runs=1 -artifact_prefix="$artifacts" "$regressions"/*
fi
"$fuzzer" -runs="$runs" -max_total_time="$max_time" -seed="${TESSERA_FUZZ_SEED:-1}" \
  -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$artifacts" -print_final_stats=1 \
  "$work" "$corpus"
