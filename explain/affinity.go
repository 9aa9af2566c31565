package explain

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// ClientIP session affinity: while a client's entry lives, each new
// connection of that client goes to the entry's endpoint (and renews the
// entry) in every mode, so the pick is not random for it: probability 1
// for that endpoint, as long as the endpoint is still one the policy
// chooses (the modes keep affinity rules for those only, and forget or
// pass over entries of the others).

// maxAffinitySkipped bounds the unusable entries a Model remembers.
const maxAffinitySkipped = 5

// readAffinity keeps snap's affinity entries: those naming a service port
// of the model, with addresses that parse. The others are skipped, and the
// answer for a Service with affinity says so.
func (m *Model) readAffinity(snap *statusapi.Snapshot) {
	m.AffinityRead, m.AffinityError = snap.Affinity != nil, snap.AffinityError
	skipped := 0
	for i, x := range snap.Affinity {
		e, err := affinityEntry(m.State, x)
		if err != nil {
			if skipped++; skipped <= maxAffinitySkipped {
				m.affinitySkipped = append(m.affinitySkipped, fmt.Sprintf("affinity[%d]: %v", i, err))
			}
			continue
		}
		m.Affinity = append(m.Affinity, e)
	}
	if skipped > maxAffinitySkipped {
		m.affinitySkipped = append(m.affinitySkipped, fmt.Sprintf("and %d more", skipped-maxAffinitySkipped))
	}
}

func affinityEntry(st *proxy.State, x statusapi.AffinityEntry) (proxy.AffinityEntry, error) {
	name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: x.Namespace, Name: x.Name},
		Port: x.PortName, Protocol: v1.Protocol(x.Protocol)}
	e := proxy.AffinityEntry{ServicePort: name, Expires: time.Duration(min(max(x.ExpiresSeconds, 0), math.MaxInt32)) * time.Second}
	if _, ok := st.Services[name]; !ok {
		return e, fmt.Errorf("no service port %s in the snapshot", proxy.QuoteBounded(name.String()))
	}
	var err error
	if e.Client, err = netip.ParseAddr(x.Client); err != nil {
		return e, fmt.Errorf("client: %w", err)
	}
	if e.Endpoint, err = netip.ParseAddrPort(x.Endpoint); err != nil {
		return e, fmt.Errorf("endpoint: %w", err)
	}
	switch x.Traffic {
	case "", proxy.AffinityInternal, proxy.AffinityExternal:
		e.Traffic = x.Traffic
	default:
		return e, fmt.Errorf("traffic %s: want internal, external or none", proxy.QuoteBounded(x.Traffic))
	}
	if x.Frontend != "" {
		if e.Frontend, err = netip.ParseAddrPort(x.Frontend); err != nil {
			return e, fmt.Errorf("frontend: %w", err)
		}
	}
	e.Client = e.Client.Unmap()
	e.Endpoint = netip.AddrPortFrom(e.Endpoint.Addr().Unmap(), e.Endpoint.Port())
	return e, nil
}

// PinnedEntries implements AffinityReader with the snapshot's entries.
func (m *Model) PinnedEntries(sp proxy.ServicePortName, client netip.Addr) ([]proxy.AffinityEntry, time.Time, error) {
	if !m.AffinityRead {
		why := m.AffinityError
		if why == "" {
			why = "the snapshot holds none (taken by a kp that did not read them)"
		}
		return nil, m.Time, errors.New(why)
	}
	var out []proxy.AffinityEntry
	for _, e := range m.Affinity {
		if e.ServicePort == sp && e.Client == client {
			out = append(out, e)
		}
	}
	if len(out) == 0 && m.AffinityError != "" {
		// A partial listing: this client's entry may be among the unread.
		return nil, m.Time, errors.New(m.AffinityError)
	}
	return out, m.Time, nil
}

// explainAffinity fills e.Affinity for the client of p, and, when an entry
// pins it to an endpoint the policy chooses, marks that endpoint (which it
// returns) and the others' shares.
func explainAffinity(e *Explanation, m *Model, sp *proxy.ServicePort, p Packet, r AffinityReader) *Endpoint {
	a := &Affinity{TimeoutSeconds: int64(sp.AffinityTimeout.Seconds())}
	e.Affinity = a
	if len(m.affinitySkipped) > 0 {
		e.note("the snapshot's affinity entries skipped as unusable: %s", strings.Join(m.affinitySkipped, "; "))
	}
	if !p.Src.IsValid() {
		a.PinnedNote = "ClientIP affinity: a client goes back to its last endpoint while its entry lives; give --from to name the client"
		return nil
	}
	if r == nil {
		r = m
	}
	entries, at, err := r.PinnedEntries(sp.Name, p.Src)
	if err != nil {
		a.PinnedNote = "whether this client is pinned was not read: " + err.Error()
		return nil
	}
	traffic := proxy.AffinityExternal
	if e.Address.Kind == KindClusterIP {
		traffic = proxy.AffinityInternal
	}
	var best *proxy.AffinityEntry
	var stale []string
	for i, x := range entries {
		if x.Frontend.IsValid() && x.Frontend != p.Dst {
			continue // another address's entry (ipvs: per virtual server)
		}
		if x.Traffic != "" && x.Traffic != traffic {
			continue // the other traffic's (userspace: per listener)
		}
		if i := endpointIndex(e.Endpoints, x.Endpoint); i < 0 || !e.Endpoints[i].Eligible {
			stale = append(stale, x.Endpoint.String())
			continue
		}
		if best == nil || x.Expires > best.Expires {
			best = &entries[i]
		}
	}
	if best == nil {
		a.PinnedNote = "this client has no affinity entry: the pick is random, then kept"
		if len(stale) > 0 {
			a.PinnedNote = fmt.Sprintf("this client's affinity entry names %s, no longer an endpoint the %s policy chooses: "+
				"the mode passes over it, so the pick is random, then kept", strings.Join(stale, ", "), e.Policy)
		}
		return nil
	}
	a.PinnedTo = best.Endpoint.String()
	a.PinnedSecondsLeft = int64(math.Ceil(best.Expires.Seconds()))
	if !at.IsZero() {
		a.PinnedUntil = at.Add(best.Expires).UTC().Format(time.RFC3339)
	}
	var pinned *Endpoint
	for i := range e.Endpoints {
		x := &e.Endpoints[i]
		switch {
		case x.Address == a.PinnedTo:
			x.Pinned, x.Probability, pinned = true, 1, x
			x.Detail += "; this client's affinity entry pins it here" + untilText(a)
		case x.Eligible:
			x.Probability = 0
			x.Detail += "; not for this client while its affinity entry pins it to " + a.PinnedTo
		}
	}
	return pinned
}

func endpointIndex(eps []Endpoint, a netip.AddrPort) int {
	for i, x := range eps {
		if x.Address == a.String() {
			return i
		}
	}
	return -1
}

// untilText is " until T (Ns left)" of a's entry, as far as it is known.
func untilText(a *Affinity) string {
	switch {
	case a == nil || a.PinnedTo == "":
		return ""
	case a.PinnedUntil != "":
		return fmt.Sprintf(" until %s (%ds left when read)", a.PinnedUntil, a.PinnedSecondsLeft)
	}
	return fmt.Sprintf(" for %ds more (when read)", a.PinnedSecondsLeft)
}
