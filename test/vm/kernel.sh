#!/usr/bin/env bash
# Fetches the second kernel the VM tests boot: Debian 12's
# linux-image-cloud-amd64 (6.1), with apt-get download and dpkg -x into the
# cache root test/k8s/common.sh uses ($KP_KUBE_CACHE, else
# ~/.cache/kp-test), never installed into the host's /boot. Prints the
# extracted folder (it holds boot/vmlinuz-* and lib/modules/*). Cached by
# package name and version: a second run reads only the local apt lists.
# Needs apt-get update to have been run once (CI's .ci/run does).
set -euo pipefail

meta="${KP_VM_KERNEL_PACKAGE:-linux-image-cloud-amd64}"
root="${KP_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kp-test}"

# The metapackage depends on exactly one versioned image package; the
# candidate in the local lists names it, so the cache key needs no network.
pkg="$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')"
if [ -z "$pkg" ]; then
	echo "kernel.sh: apt-cache knows no $meta (run apt-get update first?)" >&2
	exit 1
fi
version="$(apt-cache show --no-all-versions "$pkg" | awk '/^Version:/ {print $2; exit}')"
dir="$root/vm-$pkg-$version"
if [ -e "$dir/boot" ] && ls "$dir"/boot/vmlinuz-* >/dev/null 2>&1; then
	echo "$dir"
	exit 0
fi

mkdir -p "$root"
tmp="$(mktemp -d "$root/.vm-kernel.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# apt-get download as root warns that _apt cannot write the folder; the
# folder is ours and temporary, so let it.
chmod 755 "$tmp"
(cd "$tmp" && apt-get download -q "$pkg" >&2)
dpkg -x "$tmp"/"$pkg"_*.deb "$tmp/x"
rm -rf "$dir"
mv "$tmp/x" "$dir"
echo "$dir"
