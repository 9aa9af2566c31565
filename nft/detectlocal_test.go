package nft

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// Local traffic (upstream's --detect-local-mode) decides two things in
// this mode: traffic to a ClusterIP that is not local is masqueraded (the
// static cluster-dnat chain, and a Service chain with session affinity),
// and with externalTrafficPolicy Local, local traffic to an external
// address may go to any endpoint (the ext- chain). Each mode's match:
// ClusterCIDR the cluster CIDRs in @cluster-cidrs, NodeCIDR the node's pod
// CIDRs there, BridgeInterface iifname "X", InterfaceNamePrefix iifname
// "X*".
func TestLocalTrafficFollowsTheDetectLocalMode(t *testing.T) {
	for _, c := range []struct {
		name        string
		detect      proxy.DetectLocal
		cidrs       string // @cluster-cidrs' elements
		notLocal    string // the masquerade decision's match
		local       string // the ext- chain's match of local traffic
		noIPv6Local bool
	}{
		{"ClusterCIDR (the default)", proxy.DetectLocal{}, "10.244.0.0/16",
			"ip saddr != @cluster-cidrs", "ip saddr @cluster-cidrs", true},
		{"ClusterCIDR", proxy.DetectLocal{Mode: proxy.LocalModeClusterCIDR}, "10.244.0.0/16",
			"ip saddr != @cluster-cidrs", "ip saddr @cluster-cidrs", true},
		{"NodeCIDR", proxy.DetectLocal{Mode: proxy.LocalModeNodeCIDR,
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix("fd00:10:244:7::/64")}},
			"10.244.7.0/24", "ip saddr != @cluster-cidrs", "ip saddr @cluster-cidrs", false},
		{"BridgeInterface", proxy.DetectLocal{Mode: proxy.LocalModeBridgeInterface, BridgeInterface: "cbr0"}, "",
			`iifname != "cbr0"`, `iifname "cbr0"`, false},
		{"InterfaceNamePrefix", proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"}, "",
			`iifname != "veth*"`, `iifname "veth*"`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake := NewFake()
			cfg := testConfig()
			cfg.DetectLocal = c.detect
			b, err := newBackend(cfg, nil, fake)
			if err != nil {
				t.Fatal(err)
			}
			w := statetest.New(statetest.Node("node", "192.168.0.2", "fd00::2"))
			web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
			w.AddService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080")
			w.Services[web].ExternalPolicyLocal = true
			w.Services[web].ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
			mustSync(t, b, w.Next())
			dump := strings.ReplaceAll(fake.Dump(), "      ", "")
			elements := ""
			if c.cidrs != "" {
				elements = c.cidrs + ", " + c.cidrs + " (end)"
			}
			for _, want := range []string{
				"chain cluster-dnat\n    " + c.notLocal + " jump mark-for-masquerade\n    goto endpoint-dnat\n",
				"    " + c.local + " jump pick-svc-demo/web/tcp/http",
				"  set cluster-cidrs { " + elements + " }\n",
			} {
				if !strings.Contains(dump, want) {
					t.Errorf("ruleset lacks %q:\n%s", want, dump)
				}
			}
			// The IPv6 table: the same match in the interface modes; with
			// CIDRs, only when there is a CIDR of the family.
			ip6 := dump[strings.Index(dump, "table ip6 kp"):]
			v6Match := strings.Replace(c.notLocal, "ip saddr", "ip6 saddr", 1)
			if has := strings.Contains(ip6, v6Match+" jump mark-for-masquerade"); has == c.noIPv6Local {
				t.Errorf("ip6 table has %q: %v:\n%s", v6Match, has, ip6)
			}
		})
	}
}

// iifname compares what nft compares: the whole name zero-padded to
// IFNAMSIZ, or a prefix's bytes alone.
func TestIifnameExpressionsAreNfts(t *testing.T) {
	for _, c := range []struct {
		name        string
		prefix, neg bool
		text        string
		data        []byte
		op          expr.CmpOp
	}{
		{"cbr0", false, false, `iifname "cbr0"`, []byte("cbr0\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), expr.CmpOpEq},
		{"cbr0", false, true, `iifname != "cbr0"`, []byte("cbr0\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), expr.CmpOpNeq},
		{"veth", true, false, `iifname "veth*"`, []byte("veth"), expr.CmpOpEq},
		{"veth", true, true, `iifname != "veth*"`, []byte("veth"), expr.CmpOpNeq},
	} {
		r := newRule(family{name: "ip"}).iifname(c.name, c.prefix, c.neg).build("")
		meta, ok1 := r.Exprs[0].(*expr.Meta)
		cmp, ok2 := r.Exprs[1].(*expr.Cmp)
		if r.Text != c.text || len(r.Exprs) != 2 || !ok1 || !ok2 || meta.Key != expr.MetaKeyIIFNAME ||
			cmp.Op != c.op || !slices.Equal(cmp.Data, c.data) || meta.Register != cmp.Register {
			t.Errorf("%q: %q %#v", c.text, r.Text, r.Exprs)
		}
	}
}

// The kernel takes the interface matches, and nft lists them as kp wrote
// them (kp's text is nft's syntax), for a name and for a prefix.
func TestKernelInterfaceMatchesListAsWritten(t *testing.T) {
	for _, detect := range []proxy.DetectLocal{
		{Mode: proxy.LocalModeBridgeInterface, BridgeInterface: "cbr0"},
		{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
	} {
		t.Run(string(detect.Mode), func(t *testing.T) {
			ns, fd := testNetns(t)
			cfg := testConfig()
			cfg.DetectLocal = detect
			b, err := NewInNamespace(cfg, nil, fd)
			if err != nil {
				t.Fatal(err)
			}
			w := newWorld()
			web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
			w.AddService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080")
			w.Services[web].ExternalPolicyLocal = true
			w.Services[web].ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
			mustSync(t, b, w.Next())
			name, _, _ := cfg.LocalInterface()
			if detect.Mode == proxy.LocalModeInterfaceNamePrefix {
				name += "*"
			}
			listed := nftIn(t, ns, "list", "table", "ip", TableName)
			for _, want := range []string{`iifname != "` + name + `" jump mark-for-masquerade`, `iifname "` + name + `" jump pick-svc-demo/web/tcp/http`} {
				if !strings.Contains(listed, want) {
					t.Errorf("nft list lacks %q:\n%s", want, listed)
				}
			}
			// A second sync finds the kernel as its record says: no
			// chain rewritten.
			mustSync(t, b, w.Next())
		})
	}
}
