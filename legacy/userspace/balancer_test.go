package userspace

import (
	"net/netip"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func eps(s ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, e := range s {
		out = append(out, netip.MustParseAddrPort(e))
	}
	return out
}

func TestBalancer(t *testing.T) {
	a, b, c := "10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"
	client1, client2 := netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.2.2")
	type step struct {
		advance time.Duration
		update  []netip.AddrPort // non-nil: update first
		timeout time.Duration    // with update
		client  netip.Addr
		tried   []string
		want    string // "" = none
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"round robin over every endpoint in turn", []step{
			{update: eps(a, b, c), client: client1, want: a},
			{client: client1, want: b},
			{client: client2, want: c},
			{client: client1, want: a},
		}},
		{"a failed endpoint is skipped for the connection retrying", []step{
			{update: eps(a, b, c), client: client1, tried: []string{a}, want: b},
			{client: client1, tried: []string{c}, want: a},
			{client: client1, tried: []string{a, b, c}, want: ""},
		}},
		{"no endpoints, no choice", []step{
			{update: eps(), client: client1, want: ""},
		}},
		{"affinity keeps a client on its endpoint within the timeout", []step{
			{update: eps(a, b, c), timeout: 10 * time.Second, client: client1, want: a},
			{advance: 9 * time.Second, client: client1, want: a},
			{advance: 9 * time.Second, client: client1, want: a}, // each use refreshes it
			{client: client2, want: b},
		}},
		{"affinity ends after the timeout", []step{
			{update: eps(a, b, c), timeout: 10 * time.Second, client: client1, want: a},
			{advance: 10 * time.Second, client: client1, want: b},
		}},
		{"affinity yields when the remembered endpoint failed", []step{
			{update: eps(a, b), timeout: time.Minute, client: client1, want: a},
			{client: client1, tried: []string{a}, want: b},
			{client: client1, want: b}, // and remembers the new one
		}},
		{"an update applies to the next choice and drops affinity to removed endpoints", []step{
			{update: eps(a, b), timeout: time.Minute, client: client1, want: a},
			{update: eps(b, c), timeout: time.Minute, client: client1, want: c},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1000, 0)}
			bal := newBalancer(clk.now)
			for i, s := range tc.steps {
				clk.t = clk.t.Add(s.advance)
				if s.update != nil {
					bal.update(s.update, s.timeout)
				}
				tried := map[netip.AddrPort]bool{}
				for _, e := range s.tried {
					tried[netip.MustParseAddrPort(e)] = true
				}
				got, ok := bal.pick(s.client, tried)
				if s.want == "" {
					if ok {
						t.Errorf("step %d: picked %s, want none", i, got)
					}
					continue
				}
				if !ok || got != netip.MustParseAddrPort(s.want) {
					t.Errorf("step %d: picked %s (%v), want %s", i, got, ok, s.want)
				}
			}
		})
	}
}

func TestBalancerExpireForgetsIdleClients(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	bal := newBalancer(clk.now)
	bal.update(eps("10.0.1.1:80", "10.0.1.2:80"), 10*time.Second)
	bal.pick(netip.MustParseAddr("10.0.2.1"), nil)
	clk.t = clk.t.Add(5 * time.Second)
	bal.pick(netip.MustParseAddr("10.0.2.2"), nil)
	clk.t = clk.t.Add(6 * time.Second)
	bal.expire()
	if len(bal.affinity) != 1 {
		t.Errorf("after expire: %v, want only 10.0.2.2", bal.affinity)
	}
}
