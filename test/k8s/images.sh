#!/usr/bin/env bash
# Builds the container images the real-node tests (and upstream's e2e suite)
# run, as Docker-format tarballs for `ctr images import`, into a cache
# directory, and does nothing when that directory is already complete:
#
#   coredns.tar  kp.local/coredns:VERSION     minimal CoreDNS (coredns/), Corefile baked in
#   agnhost.tar  registry.k8s.io/e2e-test-images/agnhost:TAG   agnhost, busybox, curl, nc, dig...
#   busybox.tar  registry.k8s.io/e2e-test-images/busybox:TAG   Debian's busybox-static
#   pause.tar    registry.k8s.io/pause:TAG    images/pause
#   glibc-dns-testing.tar  registry.k8s.io/e2e-test-images/glibc-dns-testing:TAG
#                Debian's dig, nslookup, getent (glibc's resolver), dash
#   distroless-iptables.tar  registry.k8s.io/build-image/distroless-iptables:TAG
#                Debian's iptables, nft, ipset, conntrack, dash, which...
#   regression-issue-74839.tar  registry.k8s.io/e2e-test-images/regression-issue-74839:TAG
#                upstream's, built from the pinned k8s.io/kubernetes
#
# with images.txt (one "name ref file" line per image), the Corefile, and the
# static binaries in bin/. The e2e images carry the exact names and tags the
# e2e framework of the pinned k8s.io/kubernetes asks for (read from its
# test/utils/image/manifest.go), so no KUBE_TEST_REPO_LIST is needed.
#
#   test/k8s/images.sh            # build if missing, print the directory
#   test/k8s/images.sh --dir      # only print the directory
#   KP_KUBE_CACHE=/dir images.sh  # cache root (default: $XDG_CACHE_HOME or ~/.cache, then kp-test)
#
# The directory is images-kube-VERSION-coredns-VERSION-HASH, HASH covering
# every file the images are made from (this script, common.sh, coredns/,
# images/, test/image); test/images derives the same name. Each image is
# built by images/NAME.sh into a directory of its own, image-NAME-KEY, KEY
# covering only that image's inputs: a change to one image's script
# rebuilds that image (and those made from it) and links the others from
# their directories. Needs go, apt-get (Debian's packages: busybox-static,
# glibc-dns-testing's, distroless-iptables') and the host tools copied into
# agnhost's image (see images/agnhost.sh).
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

coredns_version="$(cd coredns && "$go" list -m -f '{{.Version}}' github.com/coredns/coredns)"
# sha256sum's own output format, over files in byte order of their paths
# from the repository root; test/images computes the same over the sources
# of the whole directory.
hash_of() {
	(cd "$repo" && find "$@" -type f ! -name '*_test.go' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
}
hash="$(hash_of test/k8s/images.sh test/k8s/common.sh test/k8s/coredns test/k8s/images test/image)"
dir="$root/images-kube-${kube_version}-coredns-${coredns_version}-${hash}"

if [ "${1:-}" = --dir ]; then
	echo "$dir"
	exit 0
fi
if [ -s "$dir/images.txt" ]; then
	echo "$dir"
	exit 0
fi

# The tags the e2e framework of this Kubernetes asks for, e.g.
#   configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.63.0"}
manifest="$("$go" list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/utils/image/manifest.go"
e2e_tag() {
	local tag
	tag="$(sed -n "s/^[[:space:]]*configs\[$1\] = Config{[^,]*, \"[^\"]*\", \"\([^\"]*\)\"}.*/\1/p" "$manifest")"
	if [ -z "$tag" ]; then
		echo "images.sh: no configs[$1] in $manifest" >&2
		exit 1
	fi
	echo "$tag"
}

# name, reference, and the inputs of its key (paths from the repository
# root, and names of images it is made from), in build order: an image
# comes after those it is made from.
images=(coredns busybox pause agnhost glibc-dns-testing distroless-iptables regression-issue-74839)
declare -A ref inputs made_from key
ref[coredns]="kp.local/coredns:${coredns_version}"
ref[busybox]="registry.k8s.io/e2e-test-images/busybox:$(e2e_tag BusyBox)"
ref[pause]="registry.k8s.io/pause:$(e2e_tag Pause)"
ref[agnhost]="registry.k8s.io/e2e-test-images/agnhost:$(e2e_tag Agnhost)"
ref[glibc-dns-testing]="registry.k8s.io/e2e-test-images/glibc-dns-testing:$(e2e_tag GlibcDnsTesting)"
ref[distroless-iptables]="registry.k8s.io/build-image/distroless-iptables:$(e2e_tag DistrolessIptables)"
ref[regression-issue-74839]="registry.k8s.io/e2e-test-images/regression-issue-74839:$(e2e_tag RegressionIssue74839)"
inputs[coredns]="test/k8s/coredns"
inputs[pause]="test/k8s/images/pause"
# agnhost is built from k8s.io/kubernetes, which test/k8s/go.mod pins.
inputs[agnhost]="test/k8s/go.mod"
inputs[regression-issue-74839]="test/k8s/go.mod"
made_from[agnhost]="busybox coredns"
made_from[glibc-dns-testing]="coredns"
# What every image is made with: mkimage (test/image), the shared shell.
common_inputs="test/k8s/common.sh test/image"

mkdir -p "$root"
tmp="$(mktemp -d "$root/.images.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT

timed() { # name command...: run, then print how long it took
	local name="$1" start=$SECONDS
	shift
	echo "images.sh: building $name" >&2
	"$@"
	echo "images.sh: $name built in $((SECONDS - start))s" >&2
}

export CGO_ENABLED=0
mkimage=""
declare -A built_in
for name in "${images[@]}"; do
	k="$(hash_of test/k8s/images/"$name".sh $common_inputs ${inputs[$name]:-})"
	for dep in ${made_from[$name]:-}; do k+="-${key[$dep]}"; done
	key[$name]="$(echo "$k ${ref[$name]}" | sha256sum | cut -c1-12)"
	built_in[$name]="$root/image-$name-${key[$name]}"
	if [ -s "${built_in[$name]}/$name.tar" ]; then
		echo "images.sh: $name: reusing ${built_in[$name]}" >&2
		continue
	fi
	if [ -z "$mkimage" ]; then
		mkimage="$tmp/mkimage"
		timed mkimage bash -c 'cd "$0" && "$1" build -trimpath -o "$2" ./test/image/mkimage' "$repo" "$go" "$mkimage"
	fi
	# images/NAME.sh writes NAME.tar (and bin/, whatever else it keeps)
	# into $out, the tarball under $image_ref; $from_NAME is the directory
	# of an image it is made from.
	out="$(mktemp -d "$root/.image-$name.XXXXXX")"
	chmod 755 "$out"
	start=$SECONDS
	(
		trap 'rm -rf "$out"' EXIT
		image_ref="${ref[$name]}"
		from_coredns="${built_in[coredns]}"
		from_busybox="${built_in[busybox]:-}"
		. "images/$name.sh"
		trap - EXIT
	)
	# A run in another worktree may have finished the same image first:
	# mv -T refuses to replace its (non-empty) directory.
	rm -rf "${built_in[$name]}"
	mv -T "$out" "${built_in[$name]}" 2>/dev/null || rm -rf "$out"
	echo "images.sh: $name (${ref[$name]}) done in $((SECONDS - start))s" >&2
done

# The directory tests read: links to each image's own.
mkdir -p "$tmp/bin"
for name in "${images[@]}"; do
	src="${built_in[$name]}"
	ln -f "$src/$name.tar" "$tmp/$name.tar" 2>/dev/null || cp "$src/$name.tar" "$tmp/$name.tar"
	for b in "$src"/bin/*; do
		[ -e "$b" ] || continue
		ln -f "$b" "$tmp/bin/" 2>/dev/null || cp "$b" "$tmp/bin/"
	done
	echo "$name ${ref[$name]} $name.tar" >>"$tmp/images.txt"
done
cp "${built_in[coredns]}/Corefile" "$tmp/Corefile"
rm -f "$tmp/mkimage"

rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
