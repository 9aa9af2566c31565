package tui

import (
	"net/netip"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// shareWindow is where kp top counts a Service port's shares seen from:
// each endpoint's counter when kp top first saw the port's current
// selection. Counting from kp proxy's start instead would mix in
// connections made under another selection (an endpoint added an hour
// ago has fewer than its peers, and rightly so).
type shareWindow struct {
	selection string
	since     time.Time
	base      map[netip.AddrPort]uint64
}

// seenShare is an endpoint's new connections since its port's window
// began (k), among its family's (n), and whether that strays from the
// expected share further than chance explains.
type seenShare struct {
	k, n     uint64
	since    time.Time
	diverges bool
}

// explainPorts explains every Service port of svcs (st is svcs as a
// State) and counts the shares seen since each port's selection last
// changed, or a counter went back (kp proxy restarted).
func (s *store) explainPorts(st *proxy.State, svcs *statusapi.Services, at time.Time) {
	s.why = map[spKey]portWhy{}
	s.seen = map[epKey]seenShare{}
	windows := map[spKey]*shareWindow{}
	for _, p := range svcs.ServicePorts {
		k := keyOf(p)
		sp := st.Services[k]
		if sp == nil {
			continue
		}
		pw := explainPort(sp, st.Endpoints[k], st.Node)
		s.why[k] = pw
		cur, counted := counters(p, pw)
		if !counted || pw.selection == "" {
			continue // a chosen endpoint not counted, or nothing to expect
		}
		w := s.windows[k]
		if w == nil || w.selection != pw.selection || !grew(w.base, cur) {
			w = &shareWindow{selection: pw.selection, since: at, base: cur}
		}
		windows[k] = w
		n := map[proxy.Family]uint64{}
		for a, c := range cur {
			n[proxy.FamilyOf(a.Addr())] += c - w.base[a]
		}
		for a, c := range cur {
			ew := pw.eps[a]
			ss := seenShare{k: c - w.base[a], n: n[ew.family], since: w.since}
			ss.diverges = pw.random && diverges(ss.k, ss.n, ew.expected)
			s.seen[epKey{k, a.String()}] = ss
		}
	}
	s.windows = windows
}

// counters are the new connections of p's endpoints that kp counts. A
// backend counts the endpoints it programs, which leaves out those no
// policy chooses (a not-ready one): shares can be told when every chosen
// endpoint is counted.
func counters(p statusapi.ServicePort, pw portWhy) (map[netip.AddrPort]uint64, bool) {
	cur := map[netip.AddrPort]uint64{}
	for _, e := range p.Endpoints {
		a, err := netip.ParseAddr(e.IP)
		if err != nil {
			return nil, false
		}
		ap := netip.AddrPortFrom(a.Unmap(), uint16(e.Port))
		switch {
		case e.Counters != nil:
			cur[ap] = e.Counters.NewConnections
		case pw.eps[ap].expected != 0:
			return nil, false
		}
	}
	return cur, true
}

// grew reports whether cur holds the endpoints of base, each counter at
// least where it was.
func grew(base, cur map[netip.AddrPort]uint64) bool {
	if len(base) != len(cur) {
		return false
	}
	for a, b := range base {
		if c, ok := cur[a]; !ok || c < b {
			return false
		}
	}
	return true
}
