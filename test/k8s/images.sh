#!/usr/bin/env bash
# Builds the container images the real-node tests (and upstream's e2e suite)
# run, as Docker-format tarballs for `ctr images import`, into a cache
# directory, and does nothing when that directory is already complete:
#
#   coredns.tar  kp.local/coredns:VERSION     minimal CoreDNS (coredns/), Corefile baked in
#   agnhost.tar  registry.k8s.io/e2e-test-images/agnhost:TAG   agnhost, busybox, curl, nc, dig...
#   busybox.tar  registry.k8s.io/e2e-test-images/busybox:TAG   Debian's busybox-static
#   pause.tar    registry.k8s.io/pause:TAG    images/pause
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
# every file the images are made from (this script, coredns/, images/,
# test/image); test/images derives the same name. Needs go, apt-get (for
# busybox-static; Debian's apt only) and the host tools copied into agnhost's
# image (see tools_layer).
set -euo pipefail

go="${GO:-go}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

kube_version="$("$go" list -m -f '{{.Version}}' k8s.io/kubernetes)"
coredns_version="$(cd coredns && "$go" list -m -f '{{.Version}}' github.com/coredns/coredns)"
# sha256sum's own output format, over files in byte order of their paths
# from the repository root; test/images computes the same.
hash="$(cd "$repo" && find test/k8s/images.sh test/k8s/coredns test/k8s/images test/image -type f ! -name '*_test.go' |
	LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)"
root="${KP_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kp-test}"
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
agnhost_ref="registry.k8s.io/e2e-test-images/agnhost:$(e2e_tag Agnhost)"
busybox_ref="registry.k8s.io/e2e-test-images/busybox:$(e2e_tag BusyBox)"
pause_ref="registry.k8s.io/pause:$(e2e_tag Pause)"
coredns_ref="kp.local/coredns:${coredns_version}"

mkdir -p "$root"
tmp="$(mktemp -d "$root/.images.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/stage"

timed() { # name command...: run, then print how long it took
	local name="$1" start=$SECONDS
	shift
	echo "images.sh: building $name" >&2
	"$@"
	echo "images.sh: $name built in $((SECONDS - start))s" >&2
}

export CGO_ENABLED=0
timed "coredns $coredns_version" \
	bash -c 'cd coredns && "$0" build -trimpath -ldflags "-s -w" -o "$1" .' "$go" "$tmp/bin/coredns"
timed "agnhost (k8s.io/kubernetes $kube_version)" \
	"$go" build -trimpath -ldflags "-s -w" -o "$tmp/bin/agnhost" k8s.io/kubernetes/test/images/agnhost
timed pause "$go" build -trimpath -ldflags "-s -w" -o "$tmp/bin/pause" ./images/pause
timed mkimage bash -c 'cd "$0" && "$1" build -trimpath -o "$2" ./test/image/mkimage' "$repo" "$go" "$tmp/mkimage"

# busybox-static from Debian: downloaded and unpacked, not installed (it
# conflicts with Debian's busybox, which a host may have). apt's sandbox user
# cannot write into root's cache, hence APT::Sandbox::User.
busybox_deb() {
	mkdir -p "$tmp/deb"
	(cd "$tmp/deb" && apt-get download -q -o APT::Sandbox::User=root busybox-static >&2)
	dpkg-deb -x "$tmp"/deb/busybox-static_*.deb "$tmp/deb/root"
	cp "$tmp/deb/root/bin/busybox" "$tmp/bin/busybox"
	dpkg-deb -f "$tmp"/deb/busybox-static_*.deb Version >"$tmp/busybox-version"
}
timed busybox-static busybox_deb

# The busybox layer: every applet as a link at its usual path, and the few
# files a shell in a pod expects. agnhost's image starts with the same
# layer, so containerd stores it once.
bb="$tmp/stage/busybox"
mkdir -p "$bb/bin" "$bb/etc" "$bb/tmp" "$bb/root"
chmod 1777 "$bb/tmp"
cp "$tmp/bin/busybox" "$bb/bin/busybox"
"$tmp/bin/busybox" --list-full | while read -r applet; do
	[ "$applet" = bin/busybox ] && continue
	mkdir -p "$bb/$(dirname "$applet")"
	ln -sf /bin/busybox "$bb/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$bb/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$bb/etc/group"

# The tools the e2e suite runs in agnhost pods besides agnhost (upstream's
# image is Alpine with them installed): curl (Services tests call it 13
# times), OpenBSD netcat (busybox's nc has no -v, -u or -z), dig, nslookup,
# ip and bash. They are the host's binaries with the shared libraries they
# load, at the same paths: Debian 12 packages curl, netcat-openbsd,
# bind9-dnsutils, iproute2, bash.
tools_layer() {
	local t="$tmp/stage/tools" src dst lib
	for pair in /usr/bin/curl:curl /usr/bin/nc:nc.openbsd /usr/bin/dig:dig /usr/bin/nslookup:nslookup \
		/sbin/ip:ip /bin/bash:bash; do
		dst="${pair%%:*}"
		if ! src="$(command -v "${pair#*:}")"; then
			echo "images.sh: ${pair#*:} is not installed (apt-get install curl netcat-openbsd bind9-dnsutils iproute2)" >&2
			exit 1
		fi
		mkdir -p "$t$(dirname "$dst")"
		cp "$src" "$t$dst"
		for lib in $(ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
			mkdir -p "$t$(dirname "$lib")"
			cp -L "$lib" "$t$lib"
		done
	done
	mkdir -p "$t/etc"
	# glibc's default without this file asks DNS before /etc/hosts.
	printf 'hosts: files dns\n' >"$t/etc/nsswitch.conf"
}
timed "agnhost's tools (host binaries)" tools_layer

# agnhost's own layer, shaped like upstream's image: /agnhost and its
# agnhost-2 link, /uploads (agnhost's upload handler), the user and group
# the security-context tests expect the image to define, and a CoreDNS at
# /coredns (the DNS tests run it from the agnhost image as a custom server).
ag="$tmp/stage/agnhost"
mkdir -p "$ag/uploads" "$ag/etc"
cp "$tmp/bin/agnhost" "$ag/agnhost"
ln -s agnhost "$ag/agnhost-2"
cp "$tmp/bin/coredns" "$ag/coredns"
cat "$bb/etc/passwd" - >"$ag/etc/passwd" <<<'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh'
cat "$bb/etc/group" - >"$ag/etc/group" <<<'user-defined-in-image:x:1000:
group-defined-in-image:x:50000:user-defined-in-image'

mkdir -p "$tmp/stage/pause" "$tmp/stage/coredns/etc/coredns"
cp "$tmp/bin/pause" "$tmp/stage/pause/pause"
cp "$tmp/bin/coredns" "$tmp/stage/coredns/coredns"
cp coredns/Corefile "$tmp/stage/coredns/etc/coredns/Corefile"
cp coredns/Corefile "$tmp/Corefile"

start=$SECONDS
mk="$tmp/mkimage"
path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"$mk" -ref "$coredns_ref" -o "$tmp/coredns.tar" -entrypoint /coredns \
	-cmd -conf -cmd /etc/coredns/Corefile "$tmp/stage/coredns" >&2
"$mk" -ref "$agnhost_ref" -o "$tmp/agnhost.tar" -env "$path" -entrypoint /agnhost -cmd pause \
	"$bb" "$tmp/stage/tools" "$ag" >&2
"$mk" -ref "$busybox_ref" -o "$tmp/busybox.tar" -env "$path" -cmd sh "$bb" >&2
"$mk" -ref "$pause_ref" -o "$tmp/pause.tar" -entrypoint /pause "$tmp/stage/pause" >&2
echo "images.sh: tarballs written in $((SECONDS - start))s" >&2
rm -rf "$tmp/stage" "$tmp/deb" "$mk"

{
	echo "coredns $coredns_ref coredns.tar"
	echo "agnhost $agnhost_ref agnhost.tar"
	echo "busybox $busybox_ref busybox.tar"
	echo "pause $pause_ref pause.tar"
} >"$tmp/images.txt"

rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
