package migrate

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// addrKind is the kind of address a probe is sent to: each is programmed
// apart in every mode (a map or chain of its own), so each is proven apart.
type addrKind string

const (
	kindClusterIP    addrKind = "ClusterIP"
	kindNodePort     addrKind = "NodePort"
	kindExternalIP   addrKind = "externalIP"
	kindLoadBalancer addrKind = "LoadBalancer IP"
)

// addrKinds is the order probes of one service port are sent in.
var addrKinds = []addrKind{kindClusterIP, kindNodePort, kindExternalIP, kindLoadBalancer}

// probe is one address of one service port to reach.
type probe struct {
	name   proxy.ServicePortName
	family proxy.Family
	kind   addrKind
	addr   netip.AddrPort
	proto  v1.Protocol
	err    error
	moved  bool // the service port's counters of family moved in its round
	// skipped: not sent, an earlier address of its service port and
	// family was not carried.
	skipped bool
}

func (p *probe) String() string {
	return fmt.Sprintf("%s %s %s %s", p.name, p.proto, p.kind, p.addr)
}

// NodePortScope is where a mode answers NodePorts by its settings
// (proxy.NodePortScope).
type NodePortScope = proxy.NodePortScope

// nodeAddrs are the node facts the probe list needs besides the State.
type nodeAddrs struct {
	// local are the node's addresses; defaultRoute those of the
	// interfaces holding a default route (the primary IPs when the Node
	// has none of a family: where nftables mode answers NodePorts then,
	// and a subset of every local address, where the others do).
	local, defaultRoute []netip.Addr
	scope               NodePortScope
}

// probesOf lists, for every TCP and UDP service port and family of its
// ClusterIPs with endpoints usable from this node, one probe per address
// the node serves
// it on: its first ClusterIP (internal endpoints), its NodePort on each
// NodePort address of the node, each externalIP and each LoadBalancer IP
// (external endpoints). The ones skipped are noted in skipped, with why.
func probesOf(st *proxy.State, node nodeAddrs) (out []probe, skipped []string) {
	npAddrs := nodePortAddrs(st, node)
	for name, sp := range st.Services {
		if sp.Protocol != v1.ProtocolTCP && sp.Protocol != v1.ProtocolUDP {
			skipped = append(skipped, fmt.Sprintf("%s: %s is not probed", name, sp.Protocol))
			continue
		}
		for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			ips := proxy.FilterAddrs(f, sp.ClusterIPs)
			if len(ips) == 0 {
				continue // not a family of the Service's
			}
			sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f, st.Endpoints[name]), st.Node)
			internal, external := sel.Cluster, sel.Cluster
			if sp.InternalPolicyLocal {
				internal = sel.Local
			}
			if sp.ExternalPolicyLocal {
				external = sel.Local
			}
			add := func(kind addrKind, eps []proxy.Endpoint, port int32, addrs ...netip.Addr) {
				if len(addrs) == 0 {
					return
				}
				if len(eps) == 0 {
					skipped = append(skipped, fmt.Sprintf("%s %s %s: no endpoint usable from this node", name, f, kind))
					return
				}
				for _, a := range addrs {
					out = append(out, probe{name: name, family: f, kind: kind, proto: sp.Protocol,
						addr: netip.AddrPortFrom(a, uint16(port))})
				}
			}
			add(kindClusterIP, internal, sp.Port, ips[0])
			if sp.NodePort != 0 {
				add(kindNodePort, external, sp.NodePort, proxy.FilterAddrs(f, npAddrs)...)
			}
			add(kindExternalIP, external, sp.Port, proxy.FilterAddrs(f, sp.ExternalIPs)...)
			lbs := proxy.FilterAddrs(f, sp.LoadBalancerIPs)
			if len(lbs) > 0 && len(sp.LoadBalancerSourceRanges) > 0 {
				// The node's own source address need not be in the
				// ranges: a drop there proves nothing either way.
				skipped = append(skipped, fmt.Sprintf("%s %s %s: loadBalancerSourceRanges, not probed from the node", name, f, kindLoadBalancer))
				lbs = nil
			}
			add(kindLoadBalancer, external, sp.Port, lbs...)
		}
	}
	slices.SortFunc(out, compareProbes)
	slices.Sort(skipped)
	return out, skipped
}

// compareProbes orders probes by service port, family, kind (addrKinds'
// order), then address.
func compareProbes(a, b probe) int {
	return cmp.Or(cmp.Compare(a.name.String(), b.name.String()), cmp.Compare(a.family, b.family),
		cmp.Compare(slices.Index(addrKinds, a.kind), slices.Index(addrKinds, b.kind)), a.addr.Compare(b.addr))
}

// rounds groups sorted probes so that no round holds two probes of one
// service port and family: a mode counts per endpoint, not per address,
// so each address is proven by the counters moving in its own round.
// Round i holds the i-th probe of every service port and family.
func rounds(probes []probe) [][]*probe {
	var out [][]*probe
	for i := 0; i < len(probes); {
		j := i
		for j < len(probes) && probes[j].name == probes[i].name && probes[j].family == probes[i].family {
			k := j - i
			if k == len(out) {
				out = append(out, nil)
			}
			out[k] = append(out[k], &probes[j])
			j++
		}
		i = j
	}
	return out
}

// nodePortAddrs lists the node's addresses a NodePort answers on
// (proxy.NodePortAddrs).
func nodePortAddrs(st *proxy.State, n nodeAddrs) []netip.Addr {
	return proxy.NodePortAddrs(st, n.scope, n.local, n.defaultRoute)
}
