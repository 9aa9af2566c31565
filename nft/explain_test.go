package nft

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

// The world of these tests: node-a (10.0.0.5, bridge 10.244.1.1), pods in
// 10.244.0.0/16, Services in 10.96.0.0/16, NodePorts on 10.0.0.5.
var explainFacts = explain.Facts{LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	NodePortIPs: addrs("10.0.0.5"), LocalAddrs: addrs("10.0.0.5", "10.244.1.1")}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

type explainSvc struct {
	sp  *proxy.ServicePort
	eps []proxy.Endpoint
}

func explainPort(name, clusterIP string, proto v1.Protocol, p int32, mods ...func(*proxy.ServicePort)) *proxy.ServicePort {
	sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: name},
		Protocol: proto}, Type: v1.ServiceTypeClusterIP, ClusterIPs: addrs(clusterIP), Port: p, Protocol: proto}
	for _, m := range mods {
		m(sp)
	}
	return sp
}

func readyAt(ip, node string) proxy.Endpoint {
	return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, Serving: true}.At(node, "")
}

func explainModel(f explain.Facts, svcs ...explainSvc) *explain.Model {
	st := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{}, Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
		Node: proxy.Node{Name: "node-a", IPs: addrs("10.0.0.5")}, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}
	for _, s := range svcs {
		st.Services[s.sp.Name] = s.sp
		st.Endpoints[s.sp.Name] = s.eps
	}
	return &explain.Model{State: st, Facts: f, Mode: "nftables"}
}

func TestExplainScratch(t *testing.T) {
	web := explainPort("web", "10.96.0.10", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30080 })
	sticky := explainPort("sticky", "10.96.0.70", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.AffinityTimeout = 3 * time.Hour })
	m := explainModel(explainFacts, explainSvc{web, []proxy.Endpoint{readyAt("10.244.1.10", "node-a"), readyAt("10.244.2.10", "node-b")}},
		explainSvc{sticky, []proxy.Endpoint{readyAt("10.244.1.10", "node-a"), readyAt("10.244.2.10", "node-b")}})
	for _, c := range [][2]string{{"10.96.0.10:80", "10.244.1.99"}, {"10.0.0.5:30080", "192.168.9.9"}, {"10.96.0.10:81", ""}, {"10.96.9.9:80", ""},
		{"10.96.0.70:80", "10.0.0.5"}, {"10.96.0.10:80", "10.244.1.10"}} {
		p, err := explain.ParsePacket(c[0], c[1])
		if err != nil {
			t.Fatal(err)
		}
		e := explain.Explain(m, p, explain.Options{RulePaths: map[string]explain.RulePather{"nftables": RulePather{}}})
		var b strings.Builder
		explain.Write(&b, e)
		t.Log(b.String())
	}
}
