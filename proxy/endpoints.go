package proxy

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// EndpointsFor merges the endpoints of one ServicePort from EndpointSlices,
// as upstream kube-proxy does: only slices labelled kubernetes.io/service-name
// with the Service's name (in its namespace) count; in each, the port whose
// name and protocol equal the ServicePort's gives the target port; the same
// address and port seen in several slices counts once (a ready copy wins).
// The result is sorted by IP, then port.
//
// Invalid parts of the slices are returned as *FieldError values and skipped
// (a bad endpoint drops that endpoint, a bad port entry drops that port).
func EndpointsFor(sp ServicePortName, slices []*discovery.EndpointSlice) ([]Endpoint, []error) {
	var infos []*sliceInfo
	var errs []error
	for _, s := range slices {
		if s == nil || s.Namespace != sp.Namespace || s.Labels[discovery.LabelServiceName] != sp.Name {
			continue
		}
		info, e := ParseEndpointSlice(s)
		errs = append(errs, e...)
		if info != nil {
			infos = append(infos, info)
		}
	}
	return mergeEndpoints(sp, infos), errs
}

// Equal reports whether two endpoints are the same in every field.
func (e Endpoint) Equal(o Endpoint) bool {
	return e.IP == o.IP && e.Port == o.Port && e.Ready == o.Ready && e.Serving == o.Serving &&
		e.Terminating == o.Terminating && e.place == o.place &&
		slices.Equal(e.ZoneHints(), o.ZoneHints()) && slices.Equal(e.NodeHints(), o.NodeHints())
}

// EndpointsEqual reports whether two endpoint lists are equal, in order.
func EndpointsEqual(a, b []Endpoint) bool {
	return slices.EqualFunc(a, b, Endpoint.Equal)
}

// sliceInfo is an EndpointSlice validated once, when it arrives, so that
// merging (done per ServicePort at every snapshot) neither re-parses nor
// re-reports it.
type sliceInfo struct {
	name    string // the slice's own name: merge order, so duplicates resolve the same way every time
	service types.NamespacedName
	ports   []slicePort
	// endpoints have every field but Port, which depends on the ServicePort.
	endpoints []Endpoint
	// merged is set when endpoints are already what mergeEndpoints makes
	// of this slice alone for its one port: sorted, deduplicated, with the
	// port set.
	merged      bool
	TriggerTime time.Time
}

type slicePort struct {
	name     string
	protocol v1.Protocol
	port     int32
}

// parseEndpointSlice validates a slice. It returns nil, and no error, for
// slices a node proxy ignores: FQDN slices, headless Services', another
// proxy's, and slices without the kubernetes.io/service-name label, which
// belong to someone else (mirroring controllers, other tools) and which
// upstream kube-proxy ignores as quietly.
func ParseEndpointSlice(s *discovery.EndpointSlice) (*sliceInfo, []error) {
	obj := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	var errs []error
	fail := func(field string, err error) {
		errs = append(errs, &FieldError{Kind: "EndpointSlice", Object: obj, Field: field, Err: err})
	}
	if _, ok := s.Labels[LabelServiceProxyName]; ok {
		return nil, nil
	}
	if _, ok := s.Labels[v1.IsHeadlessService]; ok {
		return nil, nil
	}
	var family Family
	switch s.AddressType {
	case discovery.AddressTypeIPv4:
		family = IPv4
	case discovery.AddressTypeIPv6:
		family = IPv6
	case discovery.AddressTypeFQDN:
		return nil, nil
	default:
		fail("addressType", fmt.Errorf("unsupported address type %q (want IPv4 or IPv6)", s.AddressType))
		return nil, errs
	}
	svcName := s.Labels[discovery.LabelServiceName]
	if svcName == "" {
		return nil, nil
	}
	info := &sliceInfo{name: s.Name, service: types.NamespacedName{Namespace: s.Namespace, Name: svcName}}

	if v, ok := s.Annotations[v1.EndpointsLastChangeTriggerTime]; ok {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			fail("metadata.annotations["+v1.EndpointsLastChangeTriggerTime+"]", fmt.Errorf("not an RFC 3339 time: %q", v))
		} else {
			info.TriggerTime = t
		}
	}

	for i, p := range s.Ports {
		field := fmt.Sprintf("ports[%d]", i)
		var proto v1.Protocol
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		proto, err := parseProtocol(proto)
		if err != nil {
			fail(field+".protocol", err)
			continue
		}
		if p.Port == nil {
			fail(field+".port", errors.New("not set"))
			continue
		}
		if err := checkPort(*p.Port); err != nil {
			fail(field+".port", err)
			continue
		}
		sp := slicePort{protocol: proto, port: *p.Port}
		if p.Name != nil {
			sp.name = *p.Name
		}
		if j := slices.IndexFunc(info.ports, func(o slicePort) bool { return o.name == sp.name && o.protocol == sp.protocol }); j >= 0 {
			fail(field+".name", fmt.Errorf("port name %q with protocol %s appears twice", sp.name, proto))
			continue
		}
		info.ports = append(info.ports, sp)
	}

	info.endpoints = make([]Endpoint, 0, len(s.Endpoints))
	for i, ep := range s.Endpoints {
		field := func() string { return fmt.Sprintf("endpoints[%d].addresses", i) } // on failures alone
		if len(ep.Addresses) == 0 {
			fail(field(), errors.New("no address"))
			continue
		}
		// Upstream uses only the first address: the others are meant to be
		// the same backend reached another way.
		a, err := parseIP(ep.Addresses[0])
		if err != nil {
			fail(field()+"[0]", err)
			continue
		}
		if !family.Has(a) {
			fail(field()+"[0]", fmt.Errorf("%s address %s in a slice of addressType %s", FamilyOf(a), a, s.AddressType))
			continue
		}
		info.endpoints = append(info.endpoints, endpointFrom(a, ep))
	}
	if len(info.ports) == 1 {
		// The usual slice: one port. Its endpoints are merged now, once,
		// and a Service port with this slice alone shares them (see
		// mergeEndpoints) instead of keeping a merged copy.
		info.endpoints = mergeEndpoints(ServicePortName{Port: info.ports[0].name, Protocol: info.ports[0].protocol},
			[]*sliceInfo{info})
		info.merged = true
	}
	return info, errs
}

// endpointFrom applies the EndpointSlice rules for unset conditions: ready
// defaults to true, serving to ready, terminating to false.
func endpointFrom(a netip.Addr, ep discovery.Endpoint) Endpoint {
	e := Endpoint{IP: a, Ready: ep.Conditions.Ready == nil || *ep.Conditions.Ready}
	e.Serving = e.Ready
	if ep.Conditions.Serving != nil {
		e.Serving = *ep.Conditions.Serving
	}
	e.Terminating = ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
	var p Place
	if ep.NodeName != nil {
		p.NodeName = *ep.NodeName
	}
	if ep.Zone != nil {
		p.Zone = *ep.Zone
	}
	e = e.At(p.NodeName, p.Zone)
	if ep.Hints != nil && len(ep.Hints.ForZones)+len(ep.Hints.ForNodes) > 0 {
		h := &EndpointHints{}
		for _, z := range ep.Hints.ForZones {
			h.ForZones = append(h.ForZones, intern(z.Name))
		}
		for _, n := range ep.Hints.ForNodes {
			h.ForNodes = append(h.ForNodes, intern(n.Name))
		}
		e.Hints = h
	}
	return e
}

// intern returns the one copy of s kept for every endpoint: a cluster has
// a few zone and node names, each decoded again in the hints of every
// endpoint of every slice.
func intern(s string) string { return unique.Make(s).Value() }

// portFor returns the slice's target port for sp, or 0 when it has none.
func (s *sliceInfo) portFor(sp ServicePortName) int32 {
	for _, p := range s.ports {
		if p.name == sp.Port && p.protocol == sp.Protocol {
			return p.port
		}
	}
	return 0
}

// equal compares what a backend would see; the trigger time is left out, so a
// slice rewritten with identical endpoints is a no-op.
func (s *sliceInfo) Equal(o *sliceInfo) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.name == o.name && s.service == o.service && slices.Equal(s.ports, o.ports) &&
		EndpointsEqual(s.endpoints, o.endpoints)
}

// mergeEndpoints resolves sp's endpoints from the slices of its Service.
func mergeEndpoints(sp ServicePortName, infos []*sliceInfo) []Endpoint {
	if len(infos) == 1 && infos[0].merged && infos[0].portFor(sp) != 0 {
		return infos[0].endpoints // immutable, shared with the slice's record
	}
	infos = slices.Clone(infos)
	slices.SortFunc(infos, func(a, b *sliceInfo) int { return cmp.Compare(a.name, b.name) })
	n := 0
	for _, info := range infos {
		n += len(info.endpoints)
	}
	// Kept until the next change: sized once, not grown by append (which
	// leaves a third of it unused at 10 endpoints).
	out := make([]Endpoint, 0, n)
	seen := make(map[netip.AddrPort]int, n)
	for _, info := range infos {
		port := info.portFor(sp)
		if port == 0 {
			continue
		}
		for _, ep := range info.endpoints {
			ep.Port = port
			if i, dup := seen[ep.AddrPort()]; dup {
				// Upstream keeps the ready copy: a pod moving between
				// slices must not look unready while it is in both.
				if !out[i].Ready && ep.Ready {
					out[i] = ep
				}
				continue
			}
			seen[ep.AddrPort()] = len(out)
			out = append(out, ep)
		}
	}
	slices.SortFunc(out, func(a, b Endpoint) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		return cmp.Compare(a.Port, b.Port)
	})
	if len(out) == 0 {
		return nil
	}
	return out
}
