# Sourced by build.sh, conformance-bins.sh and images.sh: what they share.
# Sets go (the go command), here (test/k8s), repo (the repository),
# kube_version (the k8s.io/kubernetes test/k8s pins) and root (the cache
# root), and cds into test/k8s. kube_ldflags prints the -ldflags that stamp
# Kubernetes binaries with that version.

go="${GO:-go}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

kube_version="$("$go" list -m -f '{{.Version}}' k8s.io/kubernetes)"
# test/apiserver's CacheRoot derives the same.
root="${KP_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kp-test}"

# The version stamps make /version (and kubectl version, and e2e.test's
# check against the API server's) report the release instead of
# v0.0.0-master.
kube_ldflags() {
	local major minor pkg flags="-s -w"
	major="${kube_version#v}"; major="${major%%.*}"
	minor="${kube_version#v*.}"; minor="${minor%%.*}"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean"
	done
	echo "$flags"
}

# exit_if_built DIR BIN...: when every BIN is an executable in DIR, print
# DIR (the scripts' answer) and exit.
exit_if_built() {
	local dir="$1" b
	shift
	for b in "$@"; do [ -x "$dir/$b" ] || return 0; done
	echo "$dir"
	exit 0
}

# stage NAME: make tmp a fresh folder in the cache root, removed if the
# script fails; publish DIR then puts it in DIR's place and prints DIR.
stage() {
	mkdir -p "$root"
	tmp="$(mktemp -d "$root/.$1.XXXXXX")"
	chmod 755 "$tmp"
	trap 'rm -rf "$tmp"' EXIT
}
publish() {
	rm -rf "$1"
	mv "$tmp" "$1"
	trap - EXIT
	echo "$1"
}
