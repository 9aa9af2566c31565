#!/usr/bin/env bash
# Builds the real Kubernetes and etcd binaries the tests run against
# (kube-apiserver, kubectl, kube-proxy, etcd; kube-controller-manager,
# kube-scheduler and kubelet for the real-node tests) into a cache directory
# keyed by their versions, and does nothing when that directory is already
# complete. A directory holding only some of them (made before a binary was
# added to the list) keeps those and gets the missing ones built.
#
#   test/k8s/build.sh            # build if missing, print the directory
#   KP_KUBE_CACHE=/dir build.sh  # cache root (default: $XDG_CACHE_HOME or ~/.cache, then kp-test)
#
# The versions come from this module's go.mod and etcd/go.mod, so bumping a
# version there is all it takes to build (and use) new binaries; the test
# helper (test/apiserver) derives the same directory name.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

etcd_version="$(cd etcd && "$go" list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
dir="$root/kube-${kube_version}-etcd-${etcd_version}"
kube_bins=(kube-apiserver kube-proxy kubectl kube-controller-manager kube-scheduler kubelet)
bins=("${kube_bins[@]}" etcd)

exit_if_built "$dir" "${bins[@]}"
stage build
for b in "${bins[@]}"; do
	if [ -x "$dir/$b" ]; then cp -p "$dir/$b" "$tmp/$b"; fi
done

ldflags="$(kube_ldflags)"

export CGO_ENABLED=0
for b in "${kube_bins[@]}"; do
	[ -x "$tmp/$b" ] && continue
	start=$SECONDS
	echo "build.sh: building $b $kube_version" >&2
	"$go" build -trimpath -ldflags "$ldflags" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b"
	echo "build.sh: $b built in $((SECONDS - start))s" >&2
done
if [ ! -x "$tmp/etcd" ]; then
	start=$SECONDS
	echo "build.sh: building etcd $etcd_version" >&2
	# go build, not go install: etcd's server module has replace directives,
	# which go install refuses.
	(cd etcd && "$go" build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
	echo "build.sh: etcd built in $((SECONDS - start))s" >&2
fi

publish "$dir"
