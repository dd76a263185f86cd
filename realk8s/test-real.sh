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
failed=0
summary=""

# run_suites LABEL BINDIR "FILE:WHAT" ...: one pytest run a suite, its exit and time summarised.
run_suites() {
  label=$1; bindir=$2; shift 2
  for suite in "$@"; do
    file=${suite%%:*}
    what=${suite#*:}
    echo "==> suite ($label): $what ($file)"
    s0=$(date +%s)
    if GPUTOPO_REALK8S_BIN="$bindir" "$python" -m pytest -m real -p no:cacheprovider -rfE "$file" $PYTEST_ARGS; then rc=0; else rc=$?; failed=1; fi
    summary="$summary
    $label, $what: exit $rc in $(( $(date +%s) - s0 )) s"
  done
}

PYTEST_ARGS="$*"
export GPUTOPO_REAL_REQUIRED=1
bindir=$(sh realk8s/build.sh | tail -n 1)
echo "==> Kubernetes 1.37 components ready in $(( $(date +%s) - t0 )) s: $bindir"
GPUTOPO_K8S_VERSION=v1.37.2 run_suites "1.37" "$bindir" \
  "tests/test_realk8s_deviceplugin.py:device plugin through kubelet's real device manager" \
  "tests/test_realk8s_scheduler.py:gangs through the real kube-scheduler and kube-apiserver" \
  "tests/test_realk8s_failover.py:two scheduler replicas on one Lease, the leader killed mid-gang" \
  "tests/test_realk8s_dra.py:DRA claims allocated by the real kube-scheduler from our ResourceSlices" \
  "tests/test_realk8s_admission.py:the chart's admission policies in the real kube-apiserver"

# The same scheduler, DRA and admission suites against Kubernetes 1.36 (realk8s/v1.36/go.mod).
t1=$(date +%s)
bindir136=$(sh realk8s/build.sh realk8s/v1.36 | tail -n 1)
echo "==> Kubernetes 1.36 components ready in $(( $(date +%s) - t1 )) s: $bindir136"
export GPUTOPO_K8S_VERSION=v1.36.3
run_suites "1.36" "$bindir136" \
  "tests/test_realk8s_scheduler.py:gangs through the real kube-scheduler and kube-apiserver" \
  "tests/test_realk8s_dra.py:DRA claims allocated by the real kube-scheduler from our ResourceSlices" \
  "tests/test_realk8s_admission.py:the chart's admission policies in the real kube-apiserver"

echo "==> real-component suites:$summary"
echo "==> test-real took $(( $(date +%s) - t0 )) s"
exit $failed
