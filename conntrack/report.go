package conntrack

import (
	"sort"
	"time"
)

// FlowReport is one flow attributed to a Service port, in the form kp flows
// prints it (its JSON is kp flows -o json).
type FlowReport struct {
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
	PortName  string `json:"portName"`
	Protocol  string `json:"protocol"`
	Via       Via    `json:"via"`
	// Client is the original source; Frontend the address it sent to.
	Client   string `json:"client"`
	Frontend string `json:"frontend"`
	// Endpoint is where the kernel sends the flow (its reply source).
	Endpoint string `json:"endpoint"`
	// EndpointState is the endpoint's condition in kp's last sync: ready,
	// serving (terminating but serving), not-ready, or gone when it is no
	// endpoint of the Service port any more, none when the flow was never
	// DNATed.
	EndpointState string `json:"endpointState"`
	State         string `json:"state"`
	// AgeSeconds is absent when the kernel keeps no timestamps.
	AgeSeconds     *float64 `json:"ageSeconds,omitempty"`
	TimeoutSeconds float64  `json:"timeoutSeconds"`
	// Packets and Bytes, both directions, are absent when the kernel does
	// not count (nf_conntrack_acct off when the flow started).
	Packets *uint64 `json:"packets,omitempty"`
	Bytes   *uint64 `json:"bytes,omitempty"`
}

// Reports attributes flows with ix and returns those addressed to a Service
// port, sorted by Service port, then endpoint, then client. keep, when not
// nil, filters them.
func Reports(flows []Flow, ix *Index, now time.Time, keep func(FlowReport) bool) []FlowReport {
	out := []FlowReport{}
	for _, f := range flows {
		a, ok := ix.Attribute(f)
		if !ok {
			continue
		}
		r := FlowReport{
			Namespace: a.ServicePort.Namespace, Service: a.ServicePort.Name, PortName: a.ServicePort.Port,
			Protocol: f.ProtocolName(), Via: a.Via,
			Client: f.Orig.Src.String(), Frontend: f.Orig.Dst.String(), Endpoint: a.Endpoint.String(),
			EndpointState:  endpointState(f, a),
			State:          f.State(),
			TimeoutSeconds: f.Timeout.Seconds(),
		}
		if !f.Start.IsZero() {
			age := f.Age(now).Seconds()
			r.AgeSeconds = &age
		}
		if f.OrigPackets+f.ReplyPackets > 0 {
			p, b := f.OrigPackets+f.ReplyPackets, f.OrigBytes+f.ReplyBytes
			r.Packets, r.Bytes = &p, &b
		}
		if keep == nil || keep(r) {
			out = append(out, r)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		for _, c := range [][2]string{{a.Namespace, b.Namespace}, {a.Service, b.Service}, {a.PortName, b.PortName},
			{a.Protocol, b.Protocol}, {a.Endpoint, b.Endpoint}, {a.Client, b.Client}} {
			if c[0] != c[1] {
				return c[0] < c[1]
			}
		}
		return false
	})
	return out
}

func endpointState(f Flow, a Attribution) string {
	switch {
	case !f.DNATed():
		return "none"
	case !a.Known:
		return "gone"
	case a.Info.Ready:
		return "ready"
	case a.Info.Serving:
		return "serving"
	}
	return "not-ready"
}
