# Sourced by images.sh (see there for what it sets): the busybox image,
# Debian's busybox-static with every applet linked at its usual path. Its
# tree stays in $out/rootfs: agnhost's image starts with the same layer, so
# containerd stores it once.

# Downloaded and unpacked, not installed (it conflicts with Debian's
# busybox, which a host may have). apt's sandbox user cannot write into
# root's cache, hence APT::Sandbox::User.
busybox_deb() {
	mkdir -p "$out/deb" "$out/bin"
	(cd "$out/deb" && apt-get download -q -o APT::Sandbox::User=root busybox-static >&2)
	dpkg-deb -x "$out"/deb/busybox-static_*.deb "$out/deb/root"
	cp "$out/deb/root/bin/busybox" "$out/bin/busybox"
	dpkg-deb -f "$out"/deb/busybox-static_*.deb Version >"$out/busybox-version"
	rm -rf "$out/deb"
}
timed busybox-static busybox_deb

# The few files a shell in a pod expects besides the applets.
bb="$out/rootfs"
mkdir -p "$bb/bin" "$bb/etc" "$bb/tmp" "$bb/root"
chmod 1777 "$bb/tmp"
cp "$out/bin/busybox" "$bb/bin/busybox"
"$out/bin/busybox" --list-full | while read -r applet; do
	[ "$applet" = bin/busybox ] && continue
	mkdir -p "$bb/$(dirname "$applet")"
	ln -sf /bin/busybox "$bb/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$bb/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$bb/etc/group"
path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"$mkimage" -ref "$image_ref" -o "$out/busybox.tar" -env "$path" -cmd sh "$bb" >&2
