package nft

import (
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
)

// The Cluster policy's masquerade decision is one static rule in
// cluster-dnat, not a rule per Service chain (a Service port without
// session affinity has no chain: its ClusterIP jumps to its pick chain,
// and the services chain goes on to cluster-dnat); a Service with session
// affinity (which DNATs in its own chain) keeps it as its first rule.
// masqBeforePick is a Service chain's own masquerade decision.
const masqBeforePick = "ip saddr != @cluster-cidrs jump mark-for-masquerade comment \"demo/web:http\""

func TestClusterMasqueradeDecisionIsOneStaticRule(t *testing.T) {
	for _, c := range []struct {
		name          string
		masqueradeAll bool
		affinity      bool
		want, not     []string
	}{
		{
			name: "cluster CIDRs",
			want: []string{
				"chain cluster-dnat\n    ip saddr != @cluster-cidrs jump mark-for-masquerade\n    goto endpoint-dnat\n",
				"set service-slots { 10.96.0.10 . tcp . 80 : 0x0",
				"chain services\n    meta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn fib daddr type local return\n" +
					"    ct mark set ip daddr . meta l4proto . th dport map @service-slots goto shared-pick\n" +
					"    ip daddr . meta l4proto . th dport vmap @service-ips\n    ip daddr . meta l4proto . th dport @cluster-picked goto cluster-dnat\n",
				"ct mark set ct mark & 0x00ffffff\n    goto cluster-dnat\n",
			},
			not: []string{masqBeforePick, "chain svc-"},
		},
		{
			name:          "--masquerade-all",
			masqueradeAll: true,
			want:          []string{"chain cluster-dnat\n    jump mark-for-masquerade\n    goto endpoint-dnat\n"},
			not:           []string{"chain svc-"},
		},
		{
			name:     "session affinity",
			affinity: true,
			want:     []string{"chain svc-demo/web/tcp/http\n    ip saddr != @cluster-cidrs jump mark-for-masquerade comment \"demo/web:http\"\n"},
			not:      []string{"goto cluster-dnat comment"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake := NewFake()
			cfg := testConfig()
			cfg.MasqueradeAll = c.masqueradeAll
			b, err := newBackend(cfg, nil, fake)
			if err != nil {
				t.Fatal(err)
			}
			w := newWorld()
			web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
			w.AddService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080", "10.244.1.3:8080")
			if c.affinity {
				w.Services[web].AffinityTimeout = time.Hour
			}
			mustSync(t, b, w.Next())
			dump := strings.ReplaceAll(fake.Dump(), "      ", "")
			for _, want := range c.want {
				if !strings.Contains(dump, want) {
					t.Errorf("ruleset lacks %q:\n%s", want, dump)
				}
			}
			for _, not := range c.not {
				if strings.Contains(dump, not) {
					t.Errorf("ruleset has %q:\n%s", not, dump)
				}
			}
		})
	}
}
