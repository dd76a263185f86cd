#!/bin/sh
# Builds the real Kubernetes components gputopo's `make test-real` runs against, from the Go
# modules this folder's go.mod requires (k8s.io/kubernetes and its staging modules, etcd):
#   kube-apiserver, kube-scheduler   their cmd/ packages, unchanged
#   etcd                             go.etcd.io/etcd/server/v3, the version Kubernetes pins
#   kubelet-devicemanager            cmd/kubelet-devicemanager here: kubelet's own device and
#                                    topology managers, wired as kubelet wires them
# into realk8s/.build/<kubernetes version>/bin (git-ignored), and prints that folder on its last
# line. The go command caches modules ($GOMODCACHE) and compiled packages ($GOCACHE): a cold
# build on a 2-core machine takes tens of minutes (docs/testing.md has the measured times), a
# warm one seconds. Usage: realk8s/build.sh [MODULE_DIR] (default: this folder, Kubernetes 1.37).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mod=${1:-$here}
mod=$(cd "$mod" && pwd)
if ! command -v go >/dev/null 2>&1; then
  echo "realk8s/build.sh: Go is not installed (the real components are built from Go modules)" >&2
  exit 3
fi
cd "$mod"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
[ -n "$version" ] || { echo "realk8s/build.sh: $mod/go.mod requires no k8s.io/kubernetes" >&2; exit 2; }
out="$here/.build/$version/bin"
mkdir -p "$out"
echo "==> $(go version); Kubernetes $version from $mod/go.mod into $out" >&2
echo "==> module download (cached in $(go env GOMODCACHE))" >&2
go mod download
start=$(date +%s)
step() {
  name=$1; shift
  t0=$(date +%s)
  echo "==> building $name (cached in $(go env GOCACHE))" >&2
  go build -o "$out/$name" "$@"
  echo "    $name: $(( $(date +%s) - t0 )) s" >&2
}
step etcd go.etcd.io/etcd/server/v3
step kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
step kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
if [ -d "$mod/cmd/kubelet-devicemanager" ]; then
  step kubelet-devicemanager ./cmd/kubelet-devicemanager
fi
echo "==> built in $(( $(date +%s) - start )) s: $(ls "$out" | tr '\n' ' ')" >&2
echo "$out"
