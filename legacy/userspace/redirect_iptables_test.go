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
		Listeners: []Listener{{Protocol: v1.ProtocolTCP, Port: 40001, Comment: "demo/web:http"},
			{Protocol: v1.ProtocolTCP, Port: 40002, Comment: "demo/web:http external"},
			{Protocol: v1.ProtocolUDP, Port: 40003, Comment: "demo/dns"}},
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
KP-USERSPACE-PORTALS: NodePorts: -d 192.168.0.0/16 -m addrtype --dst-type LOCAL -j KP-USERSPACE-NODEPORTS
KP-USERSPACE-NODEPORTS: demo/web:http: -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
KP-USERSPACE-SERVICES: demo/web: -d 10.96.0.10/32 -j REJECT
KP-USERSPACE-SERVICES: demo/dns: -d 10.96.0.12/32 -p udp -m udp --dport 53 -j REJECT
KP-USERSPACE-SERVICES: demo/web:http: -d 203.0.113.7/32 -p tcp -m tcp --dport 80 -j DROP
KP-USERSPACE-SERVICES: NodePorts: -m addrtype --dst-type LOCAL -j KP-USERSPACE-NPREJECT
KP-USERSPACE-NPREJECT: demo/db: -p tcp -m tcp --dport 30432 -j REJECT --reject-with tcp-reset
KP-USERSPACE-UNALLOCATED: unallocated Service addresses: -d 10.96.0.0/16 -j DROP
KP-USERSPACE-LISTENERS: demo/web:http: -p tcp -m tcp --dport 40001 -j REJECT --reject-with tcp-reset
KP-USERSPACE-LISTENERS: demo/web:http external: -p tcp -m tcp --dport 40002 -j REJECT --reject-with tcp-reset
KP-USERSPACE-LISTENERS: demo/dns: -p udp -m udp --dport 40003 -j REJECT`
	if s := strings.Join(lines, "\n"); s != want {
		t.Errorf("chains:\n%s\nwant\n%s", s, want)
	}
	if got.Prefix != "KP-USERSPACE-" || len(got.Jumps) != 8 {
		t.Errorf("prefix %q, %d jumps", got.Prefix, len(got.Jumps))
	}
	// The listeners' chain sees only new connections nat did not redirect.
	if j := got.Jumps[7]; j.From != "INPUT" || j.To != chainListeners ||
		j.Match != "-m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT" {
		t.Errorf("the listeners' jump: %+v", j)
	}
}

// At 10,000 service ports (each a ClusterIP and a NodePort, half without
// endpoints, and two listeners) no chain holds more than a trie node's rules: a new
// connection walks tens of rules, not thousands.
func TestRenderIPTablesAt10000ServicesKeepsEveryChainShort(t *testing.T) {
	var rules Rules
	for i := range 10000 {
		a := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		r := Redirect{Comment: "demo/s", Addr: a, Protocol: v1.ProtocolTCP, Port: 80, ToPort: 40000 + i%20000}
		np := Redirect{Comment: "demo/s", NodePort: true, Protocol: v1.ProtocolTCP, Port: int32(30000 + i%2768), ToPort: r.ToPort}
		if i%2 == 0 {
			rules.Redirects = append(rules.Redirects, r, np)
		} else {
			r.Verdict, np.Verdict = VerdictReject, VerdictReject
			rules.Rejects = append(rules.Rejects, r, np)
		}
		rules.Rejects = append(rules.Rejects, Redirect{Comment: "demo/s", Addr: a, Verdict: VerdictReject})
		rules.Listeners = append(rules.Listeners, Listener{Protocol: v1.ProtocolTCP, Port: 20000 + 2*i},
			Listener{Protocol: v1.ProtocolTCP, Port: 20001 + 2*i})
	}
	got := renderIPTables(proxy.IPv4, rules)
	longest := 0
	for _, c := range got.Chains {
		if len(c.Name) > 28 {
			t.Errorf("chain name %s is longer than iptables' 28 characters", c.Name)
		}
		longest = max(longest, len(c.Rules))
	}
	if longest > 40 {
		t.Errorf("the longest chain holds %d rules at 10,000 service ports", longest)
	}
}
