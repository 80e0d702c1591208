#!/usr/bin/env bash
# Runs a Python test file of this package under $TESSERA_PYTHON (the Python environment of
# deploy/install-deps.sh; bazel/python.bzl sets it) with the `tessera` package
# (client/python/site) importable, and exits with its status.
#   run_python_test.sh <test file, relative to the runfiles root> [args...]
# Working directory: the runfiles tree of the workspace (Bazel sets it for sh_test).
set -uo pipefail
test_file=${1:?usage: run_python_test.sh TEST_FILE [ARGS...]}
shift
PYTHON=${TESSERA_PYTHON:?run through python_sh_test (bazel/python.bzl), which sets TESSERA_PYTHON}
export PYTHONPATH="$PWD/client/python/site:$PWD/client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
# -P: the test file's directory must not shadow the built package (client/python/tessera).
"$PYTHON" -P "$test_file" "$@"
rc=$?
[ "$rc" -eq 0 ] && echo "PASS: $test_file" || echo "FAIL: $test_file (exit status $rc)"
exit "$rc"
