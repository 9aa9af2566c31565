package tui

import (
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// spKey names a ServicePort across snapshots.
type spKey = proxy.ServicePortName

func keyOf(p statusapi.ServicePort) spKey {
	k := spKey{Port: p.PortName}
	k.Namespace, k.Name = p.Namespace, p.Name
	k.Protocol = v1.Protocol(p.Protocol)
	return k
}

// epKey names one endpoint of one ServicePort.
type epKey struct {
	sp spKey
	ep string // ip:port
}

func endpointAddr(e statusapi.Endpoint) string {
	a, err := netip.ParseAddr(e.IP)
	if err != nil {
		return fmt.Sprintf("%s:%d", e.IP, e.Port)
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(e.Port)).String()
}

// flowKey identifies a conntrack entry by its original tuple (and zone):
// fixed for the entry's life, and in every dump and event alike.
type flowKey struct {
	proto    uint8
	zone     uint16
	src, dst netip.AddrPort
}

func flowKeyOf(f conntrack.Flow) flowKey {
	return flowKey{f.Protocol, f.Zone, f.Orig.Src, f.Orig.Dst}
}

// store is everything kp top has read, and the rates derived from
// successive reads. Only the root model changes it, in Update.
type store struct {
	status   *statusapi.Status
	services *statusapi.Services
	// statusErr is the last failure to read the status API; the last good
	// services stay on screen meanwhile.
	statusErr error
	statusAt  time.Time // last good read

	conntrackErr error // last failed dump
	watchErr     error // the event stream broke; cleared by the next event
	local        []netip.Addr
	index        *conntrack.Index
	flows        map[flowKey]conntrack.Flow
	flowsAt      time.Time // last good dump

	// Counters at the previous read, to turn them into per-interval
	// numbers.
	prevConns  map[epKey]uint64
	prevBytes  map[flowKey]uint64
	epInterval map[epKey]uint64 // new connections per endpoint, last interval
	connRate   map[spKey]float64
	bytesRate  map[spKey]float64
	// bytesKnown says two dumps were compared: a Service port missing from
	// bytesRate then had no bytes, rather than unknown ones.
	bytesKnown bool

	// why explains each Service port's endpoints (why.go); seen counts
	// their shares since windows began (shares.go).
	why     map[spKey]portWhy
	windows map[spKey]*shareWindow
	seen    map[epKey]seenShare

	now time.Time
}

func newStore() *store {
	return &store{flows: map[flowKey]conntrack.Flow{}, index: conntrack.NewIndex(nil, nil)}
}

// snapshotMsg is one read of the status API and the conntrack table.
type snapshotMsg struct {
	At        time.Time
	Status    *statusapi.Status
	Services  *statusapi.Services
	StatusErr error

	Local    []netip.Addr
	Flows    []conntrack.Flow
	FlowsErr error
}

func (s *store) applySnapshot(m snapshotMsg) {
	s.now = m.At
	if m.StatusErr == nil && m.Services != nil {
		s.applyServices(m)
	} else {
		s.statusErr = m.StatusErr
	}
	if m.FlowsErr == nil {
		s.applyDump(m)
	} else {
		s.conntrackErr = m.FlowsErr
	}
}

func (s *store) applyServices(m snapshotMsg) {
	st, err := statusapi.StateFromServices(m.Services)
	if err != nil {
		s.statusErr = fmt.Errorf("kp proxy's status API: %w", err)
		return
	}
	dt := m.At.Sub(s.statusAt).Seconds()
	first := s.prevConns == nil
	conns := map[epKey]uint64{}
	s.epInterval = map[epKey]uint64{}
	s.connRate = map[spKey]float64{}
	for _, p := range m.Services.ServicePorts {
		k := keyOf(p)
		var sum uint64
		// Without endpoints the rate is 0; with endpoints but no counters
		// (a backend that does not count) it is unknown.
		counted := len(p.Endpoints) == 0
		for _, e := range p.Endpoints {
			if e.Counters == nil {
				continue
			}
			counted = true
			ek := epKey{k, endpointAddr(e)}
			conns[ek] = e.Counters.NewConnections
			if prev, ok := s.prevConns[ek]; ok && e.Counters.NewConnections >= prev {
				d := e.Counters.NewConnections - prev
				s.epInterval[ek] = d
				sum += d
			}
		}
		if counted && !first && dt > 0 {
			s.connRate[k] = float64(sum) / dt
		}
	}
	s.prevConns = conns
	s.status, s.services, s.statusErr, s.statusAt = m.Status, m.Services, nil, m.At
	s.index = conntrack.NewIndex(st, s.local)
	s.explainPorts(st, m.Services, m.At)
}

func (s *store) applyDump(m snapshotMsg) {
	if m.Local != nil {
		s.local = m.Local
		if s.services != nil {
			if st, err := statusapi.StateFromServices(s.services); err == nil {
				s.index = conntrack.NewIndex(st, s.local)
			}
		}
	}
	dt := m.At.Sub(s.flowsAt).Seconds()
	first := s.prevBytes == nil
	flows := make(map[flowKey]conntrack.Flow, len(m.Flows))
	bytes := make(map[flowKey]uint64, len(m.Flows))
	s.bytesRate = map[spKey]float64{}
	for _, f := range m.Flows {
		k := flowKeyOf(f)
		flows[k] = f
		b := f.OrigBytes + f.ReplyBytes
		bytes[k] = b
		a, ok := s.index.Attribute(f)
		if !ok || first || dt <= 0 {
			continue
		}
		// A flow not in the previous dump began since: all its bytes are
		// this interval's.
		if prev := s.prevBytes[k]; b >= prev {
			s.bytesRate[a.ServicePort] += float64(b-prev) / dt
		}
	}
	s.bytesKnown = !first && dt > 0
	s.flows, s.prevBytes, s.flowsAt, s.conntrackErr = flows, bytes, m.At, nil
}

// flowEventsMsg carries conntrack events, in order, as the stream
// delivered them.
type flowEventsMsg []conntrack.Event

// watchErrMsg says the conntrack event stream broke; it is restarted.
type watchErrMsg struct{ Err error }

func (s *store) applyEvents(evs flowEventsMsg) {
	for _, ev := range evs {
		k := flowKeyOf(ev.Flow)
		switch ev.Type {
		case conntrack.EventDestroy:
			delete(s.flows, k)
		default:
			f := ev.Flow
			// An update event may lack what the new event or the dump had.
			if old, ok := s.flows[k]; ok && f.Start.IsZero() {
				f.Start = old.Start
			}
			s.flows[k] = f
		}
	}
	s.watchErr = nil
}

// reports is the flow table attributed to Service ports, optionally only
// one port's flows.
func (s *store) reports(only *spKey) []conntrack.FlowReport {
	flows := make([]conntrack.Flow, 0, len(s.flows))
	for _, f := range s.flows {
		flows = append(flows, f)
	}
	var keep func(conntrack.FlowReport) bool
	if only != nil {
		keep = func(r conntrack.FlowReport) bool { return reportKey(r) == *only }
	}
	reps := conntrack.Reports(flows, s.index, s.now, keep)
	if s.proxied() {
		for i := range reps {
			if reps[i].EndpointState == endpointGone {
				reps[i].EndpointState = "proxied"
			}
		}
	}
	return reps
}

func reportKey(r conntrack.FlowReport) spKey {
	k := spKey{Port: r.PortName, Protocol: v1.Protocol(r.Protocol)}
	k.Namespace, k.Name = r.Namespace, r.Service
	return k
}

// activeFlows counts the flows of each Service port.
func (s *store) activeFlows() map[spKey]int {
	n := map[spKey]int{}
	for _, f := range s.flows {
		if a, ok := s.index.Attribute(f); ok {
			n[a.ServicePort]++
		}
	}
	return n
}

// servicePort finds a Service port of the last good read.
func (s *store) servicePort(k spKey) (statusapi.ServicePort, bool) {
	if s.services == nil {
		return statusapi.ServicePort{}, false
	}
	for _, p := range s.services.ServicePorts {
		if keyOf(p) == k {
			return p, true
		}
	}
	return statusapi.ServicePort{}, false
}

// servicePacket is what kp top explains for a Service port of the last
// good read (explain.go).
func (s *store) servicePacket(k spKey) explainRequest {
	sp, ok := s.servicePort(k)
	if !ok {
		return explainRequest{what: k.String(), err: fmt.Errorf("%s is not among kp proxy's Service ports (any more)", k)}
	}
	return servicePacket(sp, s.services.Node.IPs)
}
