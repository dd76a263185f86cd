#!/bin/sh
# Checks that a release tag (v1.2.3) is the version in every file that carries one, and prints
# `version=1.2.3` and `owner=<lowercased owner>` for the release workflow
# (.github/workflows/release.yaml). Exit 1 with one line per mismatch.
#   sh tools/release-versions.sh v0.1.0 gputopo
set -eu
tag=${1:?usage: release-versions.sh TAG OWNER}
owner=$(printf '%s' "${2:?usage: release-versions.sh TAG OWNER}" | tr '[:upper:]' '[:lower:]')
version=${tag#v}
root=$(cd "$(dirname "$0")/.." && pwd)
bad=0
check() { # what, found
    if [ "$2" != "$version" ]; then
        echo "release-versions: $1 is '$2', the tag says '$version'" >&2
        bad=1
    fi
}
check pyproject.toml "$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")"
check "Chart.yaml version" "$(sed -n 's/^version: *//p' "$root/charts/gputopo/Chart.yaml")"
check "Chart.yaml appVersion" "$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/charts/gputopo/Chart.yaml")"
for f in Dockerfile.plugin Dockerfile.scheduler; do
    check "$f ARG VERSION" "$(sed -n 's/^ARG VERSION=//p' "$root/$f")"
done
for image in gputopo-device-plugin gputopo-scheduler-extender; do
    check "deploy/base/kustomization.yaml $image" "$(awk -v n="ghcr.io/gputopo/$image" '$0 ~ "name: " n "$" {getline; sub(/.*newTag: */, ""); print}' "$root/deploy/base/kustomization.yaml")"
done
[ "$bad" = 0 ] || exit 1
echo "version=$version"
echo "owner=$owner"
