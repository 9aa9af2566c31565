package userspace

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/fuzzsync"
	v1 "k8s.io/api/core/v1"
)

// FuzzManifestToUserspace follows arbitrary manifest bytes through the
// folder source's decoder and the change tracker (fuzzsync.Check) into the
// userspace backend: listeners on 127.0.0.1 (no traffic is sent), and a
// recording redirector per family in place of nftables or iptables. After
// every change (objects removed, put back, one Service deleted and
// re-added) the listeners, their balancers' endpoints and the redirect
// rules last written must equal a fresh backend's after one sync of the
// same State; listener ports are the kernel's choice, so a rule is
// compared by the listener it reaches. Seeds: the demo's manifests, nft's
// testdata/manifests and the committed corpus
// (testdata/fuzz/FuzzManifestToUserspace).
func FuzzManifestToUserspace(f *testing.F) {
	fuzzsync.AddSeeds(f, "../../manifests/demo/*.yaml", "../../nft/testdata/manifests/*.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzsync.Check(t, data, newUserspaceRenderer)
	})
}

type userspaceRenderer struct {
	ctx context.Context
	b   *Backend
	red *dualRedirector
}

func newUserspaceRenderer(t *testing.T) fuzzsync.Renderer {
	b, err := New(proxy.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, nil,
		WithNetOps(loopbackOps()))
	if err != nil {
		t.Fatal(err)
	}
	red := &dualRedirector{written: map[proxy.Family]Rules{}}
	b.red = red
	b.noFile = func() rlimitInfo { return rlimitInfo{cur: 1 << 20, max: 1 << 20} }
	ctx, cancel := context.WithCancel(context.Background()) // ends the affinity expiry loop
	t.Cleanup(func() {
		cancel()
		b.Shutdown(context.Background())
	})
	return userspaceRenderer{ctx: ctx, b: b, red: red}
}

func (r userspaceRenderer) Sync(st *proxy.State) error { return r.b.Sync(r.ctx, st) }

// Dump lists the listeners (by service port and side) with their
// balancers' endpoints, then each family's rules with the listener port
// replaced by the listener it belongs to. A listener is found by protocol
// and port: the kernel may give a TCP and a UDP listener the same number.
func (r userspaceRenderer) Dump() string {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	type listenerKey struct {
		proto v1.Protocol
		port  int
	}
	byPort := map[listenerKey]string{}
	var lines []string
	for key, p := range r.b.proxies {
		name := fmt.Sprintf("%s external=%v", key.name, key.external)
		byPort[listenerKey{p.protocol(), p.port()}] = name
		bal := p.balancers()
		lines = append(lines, fmt.Sprintf("listener %s %s v4=%v v6=%v cluster-v4=%v cluster-v6=%v split=%v", name, p.protocol(),
			endpointsOf(bal.v4), endpointsOf(bal.v6), endpointsOf(bal.clusterV4), endpointsOf(bal.clusterV6), bal.split.Load()))
	}
	slices.Sort(lines)
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		rules := r.red.written[f]
		lines = append(lines, f.String()+" rules:")
		for _, part := range [][]Redirect{rules.Redirects, rules.Rejects} {
			for _, rd := range part {
				to := byPort[listenerKey{rd.Protocol, rd.ToPort}]
				if to == "" && rd.ToPort != 0 {
					to = fmt.Sprintf("port %d, no listener", rd.ToPort)
				}
				rd.ToPort = 0
				lines = append(lines, "  "+rd.String()+" -> "+to)
			}
		}
		lines = append(lines, fmt.Sprintf("  drop %v", rules.Drops))
	}
	return strings.Join(lines, "\n")
}

func endpointsOf(b *balancer) []netip.AddrPort {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.SortedFunc(slices.Values(b.endpoints), netip.AddrPort.Compare)
}

// dualRedirector records the rules last written per family (both).
type dualRedirector struct {
	written map[proxy.Family]Rules
}

func (d *dualRedirector) String() string              { return "recording" }
func (d *dualRedirector) families() []proxy.Family    { return []proxy.Family{proxy.IPv4, proxy.IPv6} }
func (d *dualRedirector) probe(context.Context) error { return nil }
func (d *dualRedirector) write(_ context.Context, f proxy.Family, r Rules) error {
	d.written[f] = r
	return nil
}
func (d *dualRedirector) stamp(proxy.Family) (stamp, error) { return stamp{}, nil }
func (d *dualRedirector) drifted(context.Context, proxy.Family, Rules) ([]string, error) {
	return nil, nil
}
