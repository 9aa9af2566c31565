package ipvs

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

func TestVirtualServersAreListedAsIPVSAdmPrintsThem(t *testing.T) {
	k := vsKey{Proto: v1.ProtocolTCP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 80}
	svc := keyService(k)
	svc.SchedName, svc.Flags, svc.Timeout = "rr", ipvsFlagPersistent, 10800
	d2 := destination(netip.MustParseAddrPort("10.244.2.10:8080"), 1)
	d1 := destination(netip.MustParseAddrPort("10.244.1.10:8080"), 0)
	d1.ActiveConnections = 3
	u := vsKey{Proto: v1.ProtocolUDP, Addr: netip.MustParseAddr("10.96.0.53"), Port: 53}
	usvc := keyService(u)
	usvc.SchedName = "rr"
	got := ListVirtualServers(map[vsKey]*kernelServer{
		k: {svc: svc, dests: []*ipvs.Destination{d2, d1}},
		u: {svc: usvc},
	})
	want := `Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.10:80 rr persistent 10800
  -> 10.244.1.10:8080             Masq    0      3          0
  -> 10.244.2.10:8080             Masq    1      0          0
UDP  10.96.0.53:53 rr
`
	if got != want {
		t.Errorf("listing:\n%s\nwant:\n%s", got, want)
	}
}

func TestKPsSetsAreListedSorted(t *testing.T) {
	got := listSets(map[string][]string{"KP-CLUSTER-IP": {"10.96.0.20,tcp:80", "10.96.0.10,tcp:80"}, "KP-NODE-PORT-TCP": {}})
	want := "create KP-CLUSTER-IP\nadd KP-CLUSTER-IP 10.96.0.10,tcp:80\nadd KP-CLUSTER-IP 10.96.0.20,tcp:80\ncreate KP-NODE-PORT-TCP\n"
	if got != want {
		t.Errorf("listing:\n%s\nwant:\n%s", got, want)
	}
}

// What ListRules lists of a synced State is what the RulePather reads
// back: the virtual server's listed line becomes its step's rule.
func TestListRulesFeedsTheRulePath(t *testing.T) {
	r := newIPVSRenderer(t).(ipvsRenderer)
	m := pathModel()
	if err := r.b.Sync(context.Background(), m.State); err != nil {
		t.Fatal(err)
	}
	ls, err := r.b.ListRules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var where []string
	for _, l := range ls {
		where = append(where, l.Where+" ("+l.Format+")")
		m.Rules = append(m.Rules, proxy.RuleListing{Where: l.Where, Format: l.Format, Text: l.Text})
	}
	want := []string{"ipvs virtual servers (ipvs)", "ipset KP- (ipset)", "iptables-nft IPv4 nat (iptables-save)",
		"iptables-nft IPv4 filter (iptables-save)", "iptables-nft IPv6 nat (iptables-save)", "iptables-nft IPv6 filter (iptables-save)"}
	if !slices.Equal(where, want) {
		t.Errorf("listings %q, want %q", where, want)
	}
	if !strings.Contains(ls[0].Text, "TCP  10.96.0.10:80 rr\n  -> 10.244.1.10:8080") || !strings.Contains(ls[1].Text, "add KP-CLUSTER-IP 10.96.0.10,tcp:80") {
		t.Errorf("listings:\n%s\n%s", ls[0].Text, ls[1].Text)
	}
	p, _ := explain.ParsePacket("10.96.0.10:80", "192.168.1.9")
	x := explain.Explain(m, p, explain.Options{RulePaths: map[string]explain.RulePather{"ipvs": RulePather{}}})
	i := slices.IndexFunc(x.RulePath.Steps, func(s explain.RuleStep) bool { return s.Where == "ipvs TCP 10.96.0.10:80" })
	if i < 0 || x.RulePath.Steps[i].Rule != "TCP 10.96.0.10:80 rr" {
		t.Errorf("the virtual server's step: %+v", x.RulePath.Steps)
	}
}
