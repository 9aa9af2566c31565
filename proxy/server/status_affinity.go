package server

import (
	"context"
	"math"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// affinityEntries lists the backend's ClientIP affinity entries for the
// snapshot: [] when it has none, nil (not read) with the reason when it
// cannot list them (the switcher's current mode may not) or has not
// synced; those listed before a failure, with the failure.
func affinityEntries(ctx context.Context, b proxy.Backend, st *proxy.State, mode string) ([]statusapi.AffinityEntry, string) {
	al, ok := b.(proxy.AffinityLister)
	switch {
	case !ok:
		return nil, "the " + mode + " mode does not list its session affinity entries"
	case st == nil:
		return nil, "kp has not synced yet"
	}
	entries, err := al.ListAffinity(ctx, st)
	out := make([]statusapi.AffinityEntry, 0, len(entries))
	for _, e := range entries {
		x := statusapi.AffinityEntry{Namespace: e.ServicePort.Namespace, Name: e.ServicePort.Name, PortName: e.ServicePort.Port,
			Protocol: string(e.ServicePort.Protocol), Client: e.Client.String(), Endpoint: e.Endpoint.String(),
			Traffic: e.Traffic, ExpiresSeconds: int64(math.Ceil(e.Expires.Seconds()))}
		if e.Frontend.IsValid() {
			x.Frontend = e.Frontend.String()
		}
		out = append(out, x)
	}
	switch {
	case err != nil && len(out) == 0:
		return nil, err.Error()
	case err != nil:
		return out, err.Error()
	}
	return out, ""
}
