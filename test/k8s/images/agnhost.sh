# Sourced by images.sh (see there for what it sets): upstream's agnhost,
# built from the pinned k8s.io/kubernetes, in three layers:
#
#   busybox's tree (the busybox image's layer, stored once);
#   the tools the e2e suite runs in agnhost pods besides agnhost (upstream's
#     image is Alpine with them installed): curl (the Services tests call
#     it 13 times), OpenBSD netcat (busybox's nc has no -v, -u or -z), dig,
#     nslookup, ip, bash and getent (musl's in Alpine; the DNS tests' agnhost
#     querier reads /etc/hosts through it). They are the host's binaries
#     with the shared libraries they load, at the same paths: Debian 12
#     packages curl, netcat-openbsd, bind9-dnsutils, iproute2, bash,
#     libc-bin;
#   agnhost's own, shaped like upstream's image, and what mends the
#     busybox-static base for upstream's tests (below).
mkdir -p "$out/bin"
timed "agnhost (k8s.io/kubernetes $kube_version)" \
	"$go" build -trimpath -ldflags "-s -w" -o "$out/bin/agnhost" k8s.io/kubernetes/test/images/agnhost

tools_layer() {
	local t="$out/stage/tools" src dst lib pair
	for pair in /usr/bin/curl:curl /usr/bin/nc:nc.openbsd /usr/bin/dig:dig /usr/bin/nslookup:nslookup \
		/sbin/ip:ip /bin/bash:bash /usr/bin/getent:getent; do
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

# agnhost's own layer: /agnhost and its agnhost-2 link, /uploads (agnhost's
# upload handler), the user and group the security-context tests expect
# the image to define, and a CoreDNS at /coredns (the DNS tests run it from
# the agnhost image as a custom server). Then what upstream's tests need
# of an image whose base is busybox-static rather than Alpine's busybox:
#
#   - /bin/sh is bash: busybox-static is built with FEATURE_SH_STANDALONE,
#     its shell runs its own applets before PATH, so `sh -c "… | nc -v -t
#     -w 2 host port"`, how the Services tests probe a Service, would run
#     busybox's nc (no -v, no -t) instead of /usr/bin/nc (OpenBSD netcat);
#   - /usr/bin/wget is a script asking curl: busybox-static's wget applet
#     dies of SIGSEGV before it sends anything (after getuid), and the
#     tests call wget from host-network pods;
#   - /localhost.crt and /localhost.key, a self-signed pair for localhost
#     (upstream's image has its own), with which `agnhost porter` serves
#     its TLS ports (SERVE_TLS_PORT_*): the Proxy test's https cases.
ag="$out/stage/agnhost"
mkdir -p "$ag/uploads" "$ag/etc" "$ag/bin" "$ag/usr/bin"
cp "$out/bin/agnhost" "$ag/agnhost"
ln -s agnhost "$ag/agnhost-2"
cp "$from_coredns/bin/coredns" "$ag/coredns"
cat "$from_busybox/rootfs/etc/passwd" - >"$ag/etc/passwd" <<<'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh'
cat "$from_busybox/rootfs/etc/group" - >"$ag/etc/group" <<<'user-defined-in-image:x:1000:
group-defined-in-image:x:50000:user-defined-in-image'
ln -s bash "$ag/bin/sh"
cat >"$ag/usr/bin/wget" <<'WGET'
#!/bin/bash
# kp test/k8s/images/agnhost.sh: busybox-static's wget crashes (SIGSEGV)
# in this image; the forms upstream's tests use (-q, -O -, -qO-, -T
# seconds), done by curl, quiet as wget -q.
timeout=900
urls=()
while [ $# -gt 0 ]; do
	case "$1" in
	-q | -O- | -qO-) ;;
	-O) shift ;;
	-T) shift; timeout=$1 ;;
	-T*) timeout=${1#-T} ;;
	*) urls+=("$1") ;;
	esac
	shift
done
exec curl -s -f -m "$timeout" "${urls[@]}"
WGET
chmod 755 "$ag/usr/bin/wget"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
	-subj /CN=localhost -addext subjectAltName=DNS:localhost \
	-keyout "$ag/localhost.key" -out "$ag/localhost.crt" 2>/dev/null
chmod 644 "$ag/localhost.key" "$ag/localhost.crt"

path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"$mkimage" -ref "$image_ref" -o "$out/agnhost.tar" -env "$path" -entrypoint /agnhost -cmd pause \
	"$from_busybox/rootfs" "$out/stage/tools" "$ag" >&2
rm -rf "$out/stage"
