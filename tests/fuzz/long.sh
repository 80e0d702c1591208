#!/usr/bin/env bash
# Long fuzz runs: builds the fuzzers (bazel build --config=fuzz) and runs each target (the
# Python one, objects, with atheris from .venv), one at a time, at low priority, for a number
# of executions (default 2,000,000), starting from its seed corpus, its regression inputs and
# what earlier long runs found (kept in .fuzz/<target>/, ignored by git). Prints each target's
# executions, executions per second and wall time; a crash stops that target and leaves its
# input in .fuzz/findings/ — add it under tests/fuzz/regressions/<target>/ with its fix.
#
#   tests/fuzz/long.sh                      every target, 2,000,000 executions each
#   tests/fuzz/long.sh s3_xml manifest      those targets
#   tests/fuzz/long.sh -runs=10000000 -max_total_time=3600 s3_xml
#                                           libFuzzer flags (before the targets) replace the
#                                           defaults; -jobs=N runs N processes of one target
# Exits non-zero if any target crashed.
set -uo pipefail
cd "$(dirname "$0")/../.."

flags=()
targets=()
for a in "$@"; do
  case "$a" in
    -*) flags+=("$a") ;;
    *) targets+=("$a") ;;
  esac
done
[ "${#flags[@]}" -gt 0 ] || flags=(-runs=2000000)
if [ "${#targets[@]}" -eq 0 ]; then
  targets=($(bazel query 'attr(tags, "\bfuzz\b", kind(cc_binary, //tests/fuzz:*))' 2>/dev/null |
    sed -e 's/.*://' -e 's/_fuzzer$//') objects)
fi
labels=()
for t in "${targets[@]}"; do [ "$t" = objects ] || labels+=("//tests/fuzz:${t}_fuzzer"); done
if [ "${#labels[@]}" -gt 0 ]; then bazel build --config=fuzz "${labels[@]}" || exit 1; fi
bin=$(bazel info --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz

mkdir -p .fuzz/findings
failed=0
for t in "${targets[@]}"; do
  mkdir -p ".fuzz/$t"
  log=".fuzz/$t.log"
  seeds=(tests/fuzz/corpus/"$t")
  [ -d "tests/fuzz/regressions/$t" ] && seeds+=(tests/fuzz/regressions/"$t")
  start=$(date +%s)
  fuzzer=("$bin/${t}_fuzzer")
  # The Python target runs under the Python environment (deploy/install-deps.sh), with atheris.
  [ "$t" = objects ] && fuzzer=(.venv/bin/python -P tests/fuzz/objects_fuzzer.py)
  nice -n 10 "${fuzzer[@]}" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix=".fuzz/findings/$t-" "${flags[@]}" ".fuzz/$t" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  verdict=ok
  if [ "$rc" -ne 0 ]; then
    verdict="CRASH (exit $rc): $(grep -m1 -E 'SUMMARY|ERROR' "$log"); input: $(grep -o '\.fuzz/findings/[^ ]*' "$log" | tail -1)"
    failed=1
  fi
  echo "$t: ${execs:-?} executions, ${rate:-?} exec/s, $(( $(date +%s) - start )) s: $verdict (log: $log)"
done
exit $failed
