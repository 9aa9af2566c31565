# Sourced by images.sh (see there for what it sets): the image upstream's
# "KubeProxy should set TCP CLOSE_WAIT timeout" test runs privileged on a
# node's host network, as `sleep 600`, then asks through `/bin/sh -c`:
#
#   test -f /proc/net/nf_conntrack
#   cat /proc/net/nf_conntrack | grep -m 1 -E 'CLOSE_WAIT.*dst=IP.*dport=N'
#   which conntrack                       (when the kernel has no such file)
#   conntrack -L -f ipv4 -d IP 2>/dev/null | grep -m 1 'CLOSE_WAIT.*dport=N'
#
# Upstream's (kubernetes/release images/build/distroless-iptables, the
# bookworm variant) is distroless with Debian's iptables (the wrapper
# choosing nft or legacy), ipset, kmod, an nft of its own build, and dash
# as /bin/sh with cat, chmod, grep, ln, rm, sleep and wc. This one has the
# same from Debian 12's packages, plus conntrack and which for the test's
# second branch, without apt or the rest of a Debian base:
#
#   iptables     iptables-nft/-legacy (and ip6tables, -save, -restore)
#   nftables     nft
#   ipset, conntrack, kmod (modprobe, which iptables-legacy may call)
#   dash         /bin/sh, as Debian links it
#   coreutils    sleep, cat, test, ...
#   grep
#   debianutils  which
#
# and the libraries they load, from the -deblib packages (mkimage fails
# naming a library none of them has).
mkdir -p "$out/stage/bin" "$out/stage/usr/bin" "$out/stage/usr/sbin" "$out/stage/tmp" "$out/stage/run"
chmod 1777 "$out/stage/tmp"
# The links Debian's maintainer scripts make (no package manager runs
# here): dash's /bin/sh, and update-alternatives' which and iptables, the
# latter to nft as Debian 12's default (upstream's wrapper picks the mode
# the host's rules are in; this image only serves the test above).
ln -s dash "$out/stage/bin/sh"
ln -s which.debianutils "$out/stage/usr/bin/which"
for t in iptables ip6tables; do
	for s in "" -save -restore; do
		ln -s "$t-nft$s" "$out/stage/usr/sbin/$t$s"
	done
done
libs=(libc6 libxtables12 libip4tc2 libip6tc2 libmnl0 libnftnl11 libnetfilter-conntrack3 libnfnetlink0
	libnetfilter-cthelper0 libnetfilter-queue1 libipset13 libnftables1 libjansson4 libgmp10 libedit2 libbsd0
	libmd0 libtinfo6 libkmod2 liblzma5 libzstd1 libssl3 zlib1g libacl1 libattr1 libselinux1 libpcre2-8-0)
args=()
for l in "${libs[@]}"; do args+=(-deblib "$l"); done
path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
timed "distroless-iptables (Debian packages)" \
	"$mkimage" -ref "$image_ref" -o "$out/distroless-iptables.tar" -env "$path" -cmd sh \
	-deb iptables -deb nftables -deb ipset -deb conntrack -deb kmod -deb dash -deb coreutils -deb grep \
	-deb debianutils "${args[@]}" "$out/stage" >&2
rm -rf "$out/stage"
