#!/usr/bin/env bash
# make demo: kp on a sandboxed node, no cluster needed.
#
# Builds kp and the test echo server, creates network namespaces
#
#   kpdemo-client ──veth── kpdemo-node ──kpbr0── kpdemo-pod0, kpdemo-pod1, kpdemo-pod2
#    10.244.2.2           10.244.2.1   10.244.1.1   10.244.1.10, .11, .12 (echo servers)
#
# starts `kp proxy --manifests manifests/demo` in kpdemo-node, and sends a few
# requests through the Services' ClusterIPs and NodePort, showing which pod
# answered. The sandbox stays up for you to look at; `make demo-down` removes
# it. Runs as root. Nothing leaves the namespaces: the node's default route
# points at the client, which does not forward, and the root namespace's
# firewall and sysctls are not touched.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
STATE=/tmp/kpdemo
P=kpdemo
NODE=$P-node
CLIENT=$P-client
ECHO=$STATE/echo
KP=$ROOT/bin/kp

die() { echo "make demo: $*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "run as root: the demo creates network namespaces (sudo make demo)"
for c in ip go; do
	command -v "$c" >/dev/null || die "needs '$c' on the PATH (apt-get install iproute2; Go from go.dev)"
done

trap 'echo "make demo: failed; remove what was made with: make demo-down" >&2' ERR

# A previous sandbox goes first.
bash "$ROOT/scripts/demo-down.sh" --quiet

echo "==> building bin/kp and the echo server"
mkdir -p "$STATE" "$ROOT/bin"
go build -o "$KP" ./cmd/kp
go build -o "$ECHO" ./test/echo

# inns NS CMD...: run a command inside a namespace.
inns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
# sysctl NS KEY VALUE, inside NS only (no procps needed).
nsysctl() { inns "$1" sh -c "echo $3 > /proc/sys/${2//.//}"; }
# start_bg NAME NS CMD...: start CMD in NS in the background, detached from this
# shell, logging to $STATE/NAME.log; its pid goes to $STATE/NAME.pid.
# (ip netns exec execs in place, so the pid is the program's.)
start_bg() {
	local name=$1 ns=$2; shift 2
	setsid ip netns exec "$ns" "$@" </dev/null >"$STATE/$name.log" 2>&1 &
	echo $! >"$STATE/$name.pid"
}

echo "==> creating the sandbox: $NODE, ${P}-pod0..2, $CLIENT"
for ns in $NODE $CLIENT ${P}-pod0 ${P}-pod1 ${P}-pod2; do
	ip netns add "$ns"
	ip -n "$ns" link set lo up
done

# The node: forwards, and bridged pod traffic goes through netfilter
# (br_netfilter), as on any node with a bridge CNI. Redirects off so the
# client never learns a route around the node.
nsysctl $NODE net.ipv4.ip_forward 1
nsysctl $NODE net.ipv4.conf.all.send_redirects 0
nsysctl $NODE net.ipv4.conf.default.send_redirects 0
nsysctl $NODE net.bridge.bridge-nf-call-iptables 1
nsysctl $NODE net.bridge.bridge-nf-call-ip6tables 1
# An address of its own: a bridge without one takes its lowest port's, and a
# pod that joins later would change it under the pods that cached it.
ip -n $NODE link add kpbr0 address 02:6b:70:00:00:01 type bridge
ip -n $NODE addr add 10.244.1.1/24 dev kpbr0
ip -n $NODE link set kpbr0 up

# The client, off the node: it does not forward, so the node's default route
# (needed so traffic to a Service address without a rule reaches netfilter)
# leads nowhere.
nsysctl $CLIENT net.ipv4.ip_forward 0
nsysctl $CLIENT net.ipv4.conf.all.accept_redirects 0
ip -n $NODE link add kpc0 type veth peer name eth0 netns $CLIENT
ip -n $NODE addr add 10.244.2.1/24 dev kpc0
ip -n $NODE link set kpc0 up
ip -n $CLIENT addr add 10.244.2.2/24 dev eth0
ip -n $CLIENT link set eth0 up
ip -n $NODE route add default via 10.244.2.2
ip -n $CLIENT route add 10.96.0.0/16 via 10.244.2.1
ip -n $CLIENT route add 10.244.1.0/24 via 10.244.2.1

# Three pods behind the bridge, each with an echo server on TCP 8080 and
# UDP 5353 that answers with its name and the client address it saw. Their
# addresses are the ones in manifests/demo/*.yaml.
for i in 0 1 2; do
	pod=${P}-pod$i
	ip -n $NODE link add kpv$i type veth peer name eth0 netns "$pod"
	ip -n $NODE link set kpv$i master kpbr0
	ip -n $NODE link set kpv$i type bridge_slave hairpin on
	ip -n $NODE link set kpv$i up
	ip -n "$pod" addr add 10.244.1.1$i/24 dev eth0
	ip -n "$pod" link set eth0 up
	ip -n "$pod" route add default via 10.244.1.1
	start_bg pod-$i "$pod" "$ECHO" -name pod-$i -listen :8080 -udp :5353
done

# --conntrack-max-per-core 0: the node is a network namespace, where only
# the initial one may size the conntrack table.
echo "==> starting kp proxy in $NODE (log: $STATE/kp.log)"
start_bg kp $NODE "$KP" proxy \
	--manifests "$ROOT/manifests/demo" \
	--hostname-override demo-node \
	--cluster-cidr 10.244.1.0/24 \
	--conntrack-max-per-core 0 \
	--healthz-bind-address 127.0.0.1:10256 \
	--metrics-bind-address 127.0.0.1:10249
KP_PID=$(cat $STATE/kp.pid)

# Ready when /healthz says kp has synced and the Services answer.
ready() {
	inns $NODE "$ECHO" -dial http://127.0.0.1:10256/healthz -timeout 1s >/dev/null 2>&1 &&
		inns $CLIENT "$ECHO" -dial 10.96.0.80:80 -timeout 1s >/dev/null 2>&1 &&
		inns $NODE "$ECHO" -dial 10.96.0.53:53 -net udp -timeout 1s >/dev/null 2>&1
}
for _ in $(seq 100); do
	ready && break
	kill -0 "$KP_PID" 2>/dev/null || { tail -n 30 $STATE/kp.log >&2; die "kp exited; its log is above"; }
	sleep 0.2
done
ready || { tail -n 30 $STATE/kp.log >&2; die "kp is running but the Services do not answer after 20 s; its log is above"; }

# ask NS NET ADDR: one request, printed with the pod that answered.
ask() {
	local ns=$1 net=$2 addr=$3 reply
	if reply=$(inns "$ns" "$ECHO" -dial "$addr" -net "$net" -timeout 2s 2>&1); then
		printf '  %-4s %-18s -> %s (it saw the client as %s)\n' "$net" "$addr" "${reply%% *}" "${reply#* }"
	else
		printf '  %-4s %-18s -> FAILED: %s\n' "$net" "$addr" "$reply"
	fi
}

echo
echo "ClusterIP, from the node (kpdemo-node):"
for _ in 1 2 3; do ask $NODE tcp 10.96.0.80:80; done
for _ in 1 2 3; do ask $NODE udp 10.96.0.53:53; done
echo
echo "NodePort 30080 on the node's address, from the off-node client (kpdemo-client):"
for _ in 1 2 3; do ask $CLIENT tcp 10.244.2.1:30080; done
echo
echo "The flows those requests left in the node's conntrack table (kp flows --netns $NODE):"
"$KP" flows --netns $NODE | sed 's/^/  /' || echo "  kp flows FAILED"

cat <<EOF

The sandbox is still running: kp (pid $KP_PID) in $NODE, reading $ROOT/manifests/demo
(edit a file there and kp reloads it).

Watch it live with kp top (Services, each endpoint's share of new connections, flows;
? for help, q to quit), while you send requests from another terminal:
  $KP top --netns $NODE

Look inside:
  ip netns exec $NODE nft list ruleset
  ip netns exec $CLIENT $ECHO -dial 10.244.2.1:30080
  ip netns exec $NODE $ECHO -dial 10.96.0.53:53 -net udp
  ip netns exec $NODE $ECHO -dial http://127.0.0.1:10249/metrics | grep ^kubeproxy
  $KP status                 (kp status --inventory: what programs each Service in the kernel)
  $KP flows --netns $NODE
  less $STATE/kp.log

Remove it:
  make demo-down
EOF
