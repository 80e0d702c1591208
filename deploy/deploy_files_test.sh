#!/usr/bin/env bash
# Keeps the deployment examples and the operator guide honest:
# 1. every flag named in the systemd units, deploy/config, the Kubernetes manifests, the Slurm
#    scripts and docs/OPERATIONS.md exists in the binary that receives it (its --helpfull),
#    and the command lines parse there (--only_check_args); the Kubernetes manifests are
#    valid YAML and consistent (deploy/deploy_files_check.py has the rules);
# 2. `systemd-analyze verify` accepts the units, with no warning (skipped, saying so, where
#    systemd-analyze is not installed);
# 3. the Slurm scripts pass `bash -n`, and shellcheck where it is installed.
set -uo pipefail

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
python=/usr/bin/python3  # Debian's, with python3-yaml (BAZEL.md)
[ -x "$python" ] || python=python3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
export TMPDIR=$tmp

units=(deploy/systemd/tessera-coordinator.service "deploy/systemd/tessera-agent@.service")
files=("${units[@]}" deploy/config/coordinator.flags deploy/config/coordinator.env
  deploy/config/agent.env deploy/kubernetes/*.yaml deploy/slurm/tessera_job.sbatch
  deploy/slurm/*.sh docs/OPERATIONS.md)
for f in "${files[@]}"; do [ -f "$f" ] || fail "$f is missing from the test's data"; done
[ -f deploy/kubernetes/trainer-job.yaml ] || fail "no Kubernetes manifests"

# 1. Flags.
"$python" deploy/deploy_files_check.py --coordinator=server/tessera-coordinator \
  --agent=agent/tessera-agent --cli=client/cli/tessera "${files[@]}" ||
  fail "deploy_files_check.py found problems (above)"

# 2. systemd-analyze verify, on copies that run the binaries under test.
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$tmp/units"
  for unit in "${units[@]}"; do
    sed -E "s#/usr/local/bin/(tessera-coordinator)#$PWD/server/\\1#; s#/usr/local/bin/(tessera-agent)#$PWD/agent/\\1#" \
      "$unit" >"$tmp/units/$(basename "$unit")"
    grep -q "^ExecStart=$PWD/" "$tmp/units/$(basename "$unit")" ||
      fail "$unit: ExecStart does not run /usr/local/bin/tessera-*"
  done
  out=$(cd "$tmp/units" && systemd-analyze verify ./*.service 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || [ -n "$out" ]; then
    fail "systemd-analyze verify (exit $rc): $out"
  else
    echo "systemd-analyze verify: ${#units[@]} units OK"
  fi
else
  echo "SKIPPED: systemd-analyze is not installed; the units were not verified by systemd"
fi

# 3. Shell syntax.
for script in deploy/slurm/*.sbatch deploy/slurm/*.sh; do
  bash -n "$script" || fail "$script: bash -n"
done
if command -v shellcheck >/dev/null; then
  shellcheck --severity=warning --exclude=SC1091 deploy/slurm/*.sbatch deploy/slurm/*.sh ||
    fail "shellcheck (above)"
else
  echo "SKIPPED: shellcheck is not installed"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: deployment files name real flags, parse, and verify"
