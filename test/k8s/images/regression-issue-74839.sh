# Sourced by images.sh (see there for what it sets): upstream's
# regression-issue-74839 (the "boom server" of the Conntrack test "proxy
# implementation should not be vulnerable to the invalid conntrack state
# bug"), built from the pinned k8s.io/kubernetes as agnhost is. It listens
# on TCP 9000 and, with a raw socket on each of $POD_IPS (or $POD_IP; the
# pod gets NET_RAW), answers every new connection with an out-of-window
# segment, which conntrack marks INVALID. Upstream's image is debian-base
# with the binary as its entrypoint; the binary is static and reads no
# file, so here it is alone.
mkdir -p "$out/bin" "$out/stage/tmp"
chmod 1777 "$out/stage/tmp"
timed "regression-issue-74839 (k8s.io/kubernetes $kube_version)" \
	"$go" build -trimpath -ldflags "-s -w" -o "$out/bin/regression-issue-74839" \
	k8s.io/kubernetes/test/images/regression-issue-74839
cp "$out/bin/regression-issue-74839" "$out/stage/regression-issue-74839"
"$mkimage" -ref "$image_ref" -o "$out/regression-issue-74839.tar" -entrypoint /regression-issue-74839 \
	"$out/stage" >&2
rm -rf "$out/stage"
