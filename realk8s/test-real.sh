#!/bin/sh
# `make test-real`: builds the real Kubernetes components (realk8s/build.sh) and runs each suite
# of tests/ marked `real` against them, one pytest run a suite, each printing what it ran and its
# counts. Without Go it skips with one line, except in CI (CI=true), where it must run.
# Usage: realk8s/test-real.sh PYTHON [PYTEST ARGS...]
set -eu
python=$1; shift
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1; then
  if [ "${CI:-}" = "true" ]; then
    echo "test-real: Go is not installed, and CI must run the real-component suites" >&2
    exit 1
  fi
  echo "test-real: skipped: Go is not installed (the real Kubernetes components are built from Go modules)"
  exit 0
fi
t0=$(date +%s)
bindir=$(sh realk8s/build.sh | tail -n 1)
echo "==> components ready in $(( $(date +%s) - t0 )) s: $bindir"
export GPUTOPO_REALK8S_BIN="$bindir" GPUTOPO_REAL_REQUIRED=1
failed=0
summary=""
# suite file : what it checks
for suite in \
  "tests/test_realk8s_deviceplugin.py:device plugin through kubelet's real device manager" \
  "tests/test_realk8s_scheduler.py:gangs through the real kube-scheduler and kube-apiserver" \
  "tests/test_realk8s_failover.py:two scheduler replicas on one Lease, the leader killed mid-gang" \
  "tests/test_realk8s_admission.py:the chart's admission policies in the real kube-apiserver"
do
  file=${suite%%:*}
  what=${suite#*:}
  echo "==> suite: $what ($file)"
  s0=$(date +%s)
  if "$python" -m pytest -m real -p no:cacheprovider "$file" "$@"; then rc=0; else rc=$?; failed=1; fi
  summary="$summary
    $what: exit $rc in $(( $(date +%s) - s0 )) s"
done
echo "==> real-component suites:$summary"
echo "==> test-real took $(( $(date +%s) - t0 )) s"
exit $failed
