package userspace

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

func TestRenderIPTablesHasTheNFTablesTablesSemantics(t *testing.T) {
	a := netip.MustParseAddr
	rules := Rules{
		Redirects: []Redirect{
			{Comment: "demo/web:http", Addr: a("10.96.0.10"), Protocol: v1.ProtocolTCP, Port: 80, ToPort: 40001},
			{Comment: "demo/web:http", Addr: a("203.0.113.7"), Protocol: v1.ProtocolTCP, Port: 80, ToPort: 40002,
				SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
			{Comment: "demo/web:http", Addr: a("203.0.113.7"), Protocol: v1.ProtocolTCP, Port: 80, Verdict: VerdictDrop},
			{Comment: "demo/web:http", NodePort: true, NodePortAddrs: netip.MustParsePrefix("192.168.0.0/16"),
				Protocol: v1.ProtocolTCP, Port: 30080, ToPort: 40002},
		},
		Rejects: []Redirect{
			{Comment: "demo/dns", Addr: a("10.96.0.12"), Protocol: v1.ProtocolUDP, Port: 53, Verdict: VerdictReject},
			{Comment: "demo/db", NodePort: true, Protocol: v1.ProtocolTCP, Port: 30432, Verdict: VerdictReject},
			{Comment: "demo/web", Addr: a("10.96.0.10"), Verdict: VerdictReject},
		},
		Drops: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
	}
	got := renderIPTables(proxy.IPv4, rules)
	var lines []string
	for _, c := range got.Chains {
		for _, r := range c.Rules {
			lines = append(lines, c.Name+": "+r.Comment+": "+r.Args)
		}
	}
	want := `KP-USERSPACE-PORTALS: demo/web:http: -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 40001
KP-USERSPACE-PORTALS: demo/web:http: -s 198.51.100.0/24 -d 203.0.113.7/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 40002
KP-USERSPACE-PORTALS: demo/web:http: -d 192.168.0.0/16 -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
KP-USERSPACE-SERVICES: demo/web:http: -d 203.0.113.7/32 -p tcp -m tcp --dport 80 -j DROP
KP-USERSPACE-SERVICES: demo/dns: -d 10.96.0.12/32 -p udp -m udp --dport 53 -j REJECT
KP-USERSPACE-SERVICES: demo/db: -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30432 -j REJECT --reject-with tcp-reset
KP-USERSPACE-SERVICES: demo/web: -d 10.96.0.10/32 -j REJECT
KP-USERSPACE-UNALLOCATED: unallocated Service addresses: -d 10.96.0.0/16 -j DROP`
	if s := strings.Join(lines, "\n"); s != want {
		t.Errorf("chains:\n%s\nwant\n%s", s, want)
	}
	if got.Prefix != "KP-USERSPACE-" || len(got.Jumps) != 7 {
		t.Errorf("prefix %q, %d jumps", got.Prefix, len(got.Jumps))
	}
}
