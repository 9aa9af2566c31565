package tui

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// endpointWhy is one endpoint as kp explain sees it: chosen or not under
// each traffic policy its Service port uses, with proxy.ExplainEndpoints'
// reason (the same words kp explain prints), and the share of new
// connections it should get.
type endpointWhy struct {
	family proxy.Family
	// why is "✓ ready" or "✗ not-ready"; a port that uses both policies
	// names each: "cluster ✓ ready, local ✗ not-on-this-node".
	why string
	// expected is the share of its family's new connections the endpoint
	// should get: 1/n when chosen among n, 0 when not; NaN when the port's
	// two policies choose differently (the share then depends on how much
	// traffic comes through which address, which kp cannot see).
	expected float64
}

// portWhy is a Service port's endpoints, explained.
type portWhy struct {
	eps map[netip.AddrPort]endpointWhy
	// selection names the endpoints chosen per family, and changes when
	// they do: the shares seen are counted from the last change.
	selection string
	// random says new connections pick an endpoint independently of each
	// other: no ClientIP affinity, which pins a client's connections to
	// one endpoint and so voids the binomial bound (see diverges).
	random bool
}

// explainPort explains sp's endpoints on node, one IP family at a time as
// the backends program them, with proxy.ExplainEndpoints: the selection
// and its reasons are the core's, never derived here.
func explainPort(sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node) portWhy {
	pw := portWhy{eps: map[netip.AddrPort]endpointWhy{}, random: sp.AffinityTimeout == 0}
	var sel []string
	for _, fam := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		feps := proxy.FilterEndpoints(fam, eps)
		if len(feps) == 0 {
			continue
		}
		pc := proxy.ExplainEndpoints(sp, feps, node)
		cluster, local := pc.Selection.Cluster, pc.Selection.Local
		chosen, known := cluster, true
		switch {
		case pc.Cluster == nil:
			chosen = local
		case pc.Local != nil && !sameEndpoints(cluster, local):
			known = false // the policies disagree: no single expectation
		}
		for i, e := range feps {
			w := endpointWhy{family: fam, expected: math.NaN()}
			switch {
			case pc.Cluster != nil && pc.Local != nil:
				w.why = "cluster " + mark(pc.Cluster[i]) + ", local " + mark(pc.Local[i])
			case pc.Cluster != nil:
				w.why = mark(pc.Cluster[i])
			case pc.Local != nil:
				w.why = mark(pc.Local[i])
			}
			if known {
				w.expected = 0
				if slices.ContainsFunc(chosen, func(c proxy.Endpoint) bool { return c.AddrPort() == e.AddrPort() }) {
					w.expected = 1 / float64(len(chosen))
				}
			}
			pw.eps[e.AddrPort()] = w
		}
		if known {
			sel = append(sel, fmt.Sprintf("%s:%s", fam, endpointList(chosen)))
		}
	}
	pw.selection = strings.Join(sel, " ")
	return pw
}

// mark is a choice as the WHY column shows it: chosen or not, and why.
func mark(c proxy.EndpointChoice) string {
	if c.Chosen {
		return "✓ " + string(c.Reason)
	}
	return "✗ " + string(c.Reason)
}

func sameEndpoints(a, b []proxy.Endpoint) bool {
	return endpointList(a) == endpointList(b)
}

func endpointList(eps []proxy.Endpoint) string {
	ss := make([]string, len(eps))
	for i, e := range eps {
		ss[i] = e.String()
	}
	slices.Sort(ss)
	return strings.Join(ss, ",")
}

// divergenceSigmas is how far, in standard deviations of the binomial
// distribution, a share seen may stray from the share expected before
// kp top marks it.
const divergenceSigmas = 4

// diverges reports whether k of n new connections is further from the
// expected share p than chance explains. With each connection picking an
// endpoint independently with probability p (kp's rules pick uniformly
// among the chosen endpoints), the endpoint's count is binomial: mean n·p,
// standard deviation √(n·p·(1−p)). The rule: |k − n·p| > 4·√(n·p·(1−p)) + 1.
// Four standard deviations keep a false mark to about 6 in 100,000 per
// endpoint (normal approximation); the +1 is a continuity allowance, so
// that one connection counted across a change of the selection, or to an
// endpoint that may get none (p = 0, where the deviation is 0), is no
// mark, while two are.
func diverges(k, n uint64, p float64) bool {
	if n == 0 || math.IsNaN(p) || p < 0 || p > 1 {
		return false
	}
	mean := float64(n) * p
	sd := math.Sqrt(float64(n) * p * (1 - p))
	return math.Abs(float64(k)-mean) > divergenceSigmas*sd+1
}
