#!/usr/bin/env bash
# Builds what running upstream's e2e suite (conformance, [sig-network]) takes:
# e2e.test (`go test -c k8s.io/kubernetes/test/e2e`) and the ginkgo CLI that
# runs it in parallel, at the versions this module pins, into a cache
# directory; does nothing when that directory is already complete. Only
# `make conformance` needs them, never `make test`.
#
#   test/k8s/conformance-bins.sh         # build if missing, print the directory
#   test/k8s/conformance-bins.sh --dir   # only print the directory
#   KP_KUBE_CACHE=/dir ...               # cache root (default: $XDG_CACHE_HOME or ~/.cache, then kp-test)
#
# The directory is conformance-kube-VERSION-ginkgo-VERSION; test/images
# derives the same name. go.sum holds e2e.test's test-only imports through
# tools_conformance.go.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ginkgo_version="$("$go" list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)"
dir="$root/conformance-kube-${kube_version}-ginkgo-${ginkgo_version}"
bins=(e2e.test ginkgo)

if [ "${1:-}" = --dir ]; then
	echo "$dir"
	exit 0
fi
exit_if_built "$dir" "${bins[@]}"
stage conformance

# The same version stamps as build.sh: the suite logs and checks them
# against the API server's.
ldflags="$(kube_ldflags)"

export CGO_ENABLED=0
start=$SECONDS
echo "conformance-bins.sh: building ginkgo $ginkgo_version" >&2
"$go" build -trimpath -ldflags "-s -w" -o "$tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
echo "conformance-bins.sh: ginkgo built in $((SECONDS - start))s" >&2
start=$SECONDS
echo "conformance-bins.sh: building e2e.test $kube_version" >&2
"$go" test -c -trimpath -ldflags "$ldflags" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e
echo "conformance-bins.sh: e2e.test built in $((SECONDS - start))s" >&2

publish "$dir"
