# Sourced by images.sh (see there for what it sets): the image upstream's
# DNS tests run their "jessie" querier in, beside agnhost's (musl upstream):
# a shell loop of `dig +search`, `getent hosts` (glibc's resolver, which
# reads /etc/nsswitch.conf, /etc/resolv.conf and /etc/hosts as a Debian
# program does), seq and sleep, writing into /results. Upstream's is
# debian:bookworm-slim with dnsutils and a CoreDNS at /coredns
# (kubernetes/test/images/glibc-dns-testing/Dockerfile); this one has the
# same programs from the same Debian 12 packages, without apt or the rest
# of a Debian base:
#
#   bind9-dnsutils  dig, nslookup, host (dnsutils is its transitional name)
#   libc-bin        getent
#   dash            /bin/sh, as Debian links it
#   coreutils       seq, sleep, cat, ...
#
# and the libraries they load, from the -deblib packages (mkimage fails
# naming a library none of them has).
mkdir -p "$out/stage/bin" "$out/stage/etc" "$out/stage/tmp"
chmod 1777 "$out/stage/tmp"
# dash's postinst makes this link; no package manager runs here.
ln -s dash "$out/stage/bin/sh"
cp "$from_coredns/bin/coredns" "$out/stage/coredns"
# glibc's default without this file asks DNS before /etc/hosts, and stops
# at its NOTFOUND: the /etc/hosts tests would fail.
printf 'hosts: files dns\nnetworks: files\n' >"$out/stage/etc/nsswitch.conf"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$out/stage/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$out/stage/etc/group"
libs=(libc6 bind9-libs libfstrm0 libgssapi-krb5-2 libicu72 libidn2-0 libjemalloc2 libjson-c5 libk5crypto3
	libkrb5-3 libkrb5support0 liblmdb0 libmaxminddb0 libnghttp2-14 libprotobuf-c1 libssl3 libstdc++6
	libunistring2 libuv1 libxml2 libcom-err2 libkeyutils1 libgcc-s1 liblzma5 zlib1g libcap2 libedit2 libbsd0
	libmd0 libtinfo6 libacl1 libattr1 libselinux1 libpcre2-8-0 libgmp10)
args=()
for l in "${libs[@]}"; do args+=(-deblib "$l"); done
path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
timed "glibc-dns-testing (Debian packages)" \
	"$mkimage" -ref "$image_ref" -o "$out/glibc-dns-testing.tar" -env "$path" -cmd sh \
	-deb bind9-dnsutils -deb libc-bin -deb dash -deb coreutils "${args[@]}" "$out/stage" >&2
rm -rf "$out/stage"
