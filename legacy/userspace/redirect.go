package userspace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// Redirect is one rule of the table as a plain value: traffic to Addr (or,
// with NodePort set, to any local address) on Protocol/Port, from one of
// SourceRanges when there are some, goes to the proxy's listener ToPort;
// or, by Verdict, is rejected (the service port has no usable endpoint) or
// dropped (a LoadBalancer IP's source outside its ranges).
type Redirect struct {
	Comment  string
	Addr     netip.Addr // invalid for a NodePort rule
	NodePort bool
	// NodePortAddrs narrows a NodePort rule to local addresses in it
	// (--nodeport-addresses); invalid: every local address.
	NodePortAddrs netip.Prefix
	Protocol      v1.Protocol
	Port          int32
	SourceRanges  []netip.Prefix
	ToPort        int
	Verdict       Verdict
}

// Verdict is what a rule does with the traffic it matches.
type Verdict int

const (
	VerdictRedirect Verdict = iota
	// VerdictReject refuses at once: a TCP reset, ICMP port unreachable.
	VerdictReject
	// VerdictDrop drops silently.
	VerdictDrop
)

func (r Redirect) String() string {
	dst := r.Addr.String()
	if r.NodePort {
		dst = "fib daddr type local"
		if r.NodePortAddrs.IsValid() {
			dst = "daddr " + r.NodePortAddrs.String() + " " + dst
		}
	}
	src := ""
	if len(r.SourceRanges) > 0 {
		src = fmt.Sprintf("saddr %v ", r.SourceRanges)
	}
	verdict := fmt.Sprintf("redirect to :%d", r.ToPort)
	switch r.Verdict {
	case VerdictReject:
		verdict = "reject"
	case VerdictDrop:
		verdict = "drop"
	}
	port := ""
	if r.Protocol != "" {
		port = fmt.Sprintf(" %s dport %d", strings.ToLower(string(r.Protocol)), r.Port)
	}
	return fmt.Sprintf("%s%s%s %s comment %q", src, dst, port, verdict, r.Comment)
}

// listenerPorts are the proxy's listener ports for one service port:
// internal traffic (ClusterIPs) and external (NodePort, externalIPs,
// LoadBalancer IPs).
type listenerPorts struct{ internal, external int }

// Rules is family f's table as plain values. Redirects (with the drops of
// LoadBalancer sources outside their ranges) go in the nat chains, each
// Service's first; the filter chains refuse what nat did not redirect:
// Rejects (service ports without endpoints, then any other port of a
// ClusterIP, as upstream), then Drops (addresses of the Service CIDRs no
// Service has). Listeners are the proxy's listener ports: a new
// connection to one that nat did not redirect is refused, on input.
type Rules struct {
	Redirects []Redirect
	Rejects   []Redirect
	Drops     []netip.Prefix
	Listeners []Listener
}

// Listener is one of the proxy's listener ports. A listener binds every
// address of the node (a redirect rewrites the destination to the address
// of the interface the packet came in on, so no other address would do),
// so without the filter rule a client connecting straight to
// <node IP>:<port> would reach the Service's endpoints: a ClusterIP-only
// Service from outside the cluster, a LoadBalancer's without its source
// ranges. Only connections whose conntrack entry was destination-NATed (a
// redirect is one) may reach it.
type Listener struct {
	Protocol v1.Protocol
	Port     int
	Comment  string // its service port, and "external" for the external listener
}

// renderRules returns family f's rules for every service port of s that
// has a state, sorted so that equal States render equal rules. A service
// port without usable endpoints is rejected; one with dropInternal
// (internalTrafficPolicy Local, no endpoint on this node) has its
// ClusterIPs' traffic dropped, as upstream does: a listener would accept
// the connection and could only hold it.
func renderRules(f proxy.Family, s *proxy.State, states map[proxy.ServicePortName]portState, nodePortAddrs []netip.Prefix) Rules {
	var out Rules
	var vips []Redirect
	seenVIP := map[netip.Addr]bool{}
	for name, sp := range s.Services {
		st, ok := states[name]
		if !ok {
			continue
		}
		lp := st.ports
		// add adds the rules for traffic to a:port, or to a NodePort on
		// the local addresses in nodePort (when a is invalid).
		add := func(a netip.Addr, nodePort netip.Prefix, port int32, to int, ranges []netip.Prefix) {
			r := Redirect{Comment: name.String(), Addr: a, NodePort: !a.IsValid(), NodePortAddrs: nodePort,
				Protocol: sp.Protocol, Port: port, ToPort: to}
			if !st.usable {
				r.Verdict = VerdictReject
				out.Rejects = append(out.Rejects, r)
				return
			}
			if len(ranges) > 0 {
				r.SourceRanges = ranges
				out.Redirects = append(out.Redirects, r)
				r.SourceRanges, r.Verdict = nil, VerdictDrop
			}
			out.Redirects = append(out.Redirects, r)
		}
		for _, a := range proxy.FilterAddrs(f, sp.ClusterIPs) {
			if st.dropInternal {
				out.Redirects = append(out.Redirects, Redirect{Comment: name.String(), Addr: a, Protocol: sp.Protocol,
					Port: sp.Port, Verdict: VerdictDrop})
			} else {
				add(a, netip.Prefix{}, sp.Port, lp.internal, nil)
			}
			if !seenVIP[a] {
				seenVIP[a] = true
				vips = append(vips, Redirect{Comment: name.NamespacedName.String(), Addr: a, Verdict: VerdictReject})
			}
		}
		for _, a := range proxy.FilterAddrs(f, sp.ExternalIPs) {
			add(a, netip.Prefix{}, sp.Port, lp.external, nil)
		}
		for _, a := range proxy.FilterAddrs(f, sp.LoadBalancerIPs) {
			add(a, netip.Prefix{}, sp.Port, lp.external, proxy.FilterPrefixes(f, sp.LoadBalancerSourceRanges))
		}
		if sp.NodePort != 0 {
			for _, p := range nodePortAddrs {
				add(netip.Addr{}, p, sp.NodePort, lp.external, nil)
			}
		}
	}
	// A Service's rules keep their order (a source range rule before its
	// drop); Services sort by name.
	slices.SortStableFunc(out.Redirects, func(a, b Redirect) int { return strings.Compare(a.Comment, b.Comment) })
	byText := func(a, b Redirect) int { return strings.Compare(a.String(), b.String()) }
	slices.SortFunc(out.Rejects, byText)
	slices.SortFunc(vips, byText)
	out.Rejects = append(out.Rejects, vips...)
	out.Drops = proxy.FilterPrefixes(f, s.ServiceCIDRs)
	out.Listeners = listenersOf(s, states)
	return out
}

// listenersOf lists the listener ports of the service ports of s that
// have a state (one refused for want of descriptors has none), sorted by
// protocol and port.
func listenersOf(s *proxy.State, states map[proxy.ServicePortName]portState) []Listener {
	var out []Listener
	for name, sp := range s.Services {
		st := states[name]
		if st.ports.internal != 0 {
			out = append(out, Listener{Protocol: sp.Protocol, Port: st.ports.internal, Comment: name.String()})
		}
		if st.ports.external != 0 {
			out = append(out, Listener{Protocol: sp.Protocol, Port: st.ports.external, Comment: name.String() + " external"})
		}
	}
	slices.SortFunc(out, func(a, b Listener) int {
		if c := strings.Compare(string(a.Protocol), string(b.Protocol)); c != 0 {
			return c
		}
		return a.Port - b.Port
	})
	return out
}

// writeRules renders and applies the families the redirector programs.
// A family's rules are written only when their rendering differs from what
// kp last wrote (most syncs change endpoints only, which live in the
// balancers), and at least every rewriteInterval, which repairs edits made
// behind kp's back.
func (b *Backend) writeRules(ctx context.Context, s *proxy.State, states map[proxy.ServicePortName]portState) error {
	now := b.now()
	fams := b.red.families()
	rules := map[proxy.Family]Rules{}
	var changed []proxy.Family
	for _, f := range fams {
		rules[f] = renderRules(f, s, states, b.nodePortAddrs(f, s.Node))
		last, ok := b.lastRules[f]
		if !ok || now.Sub(b.lastWrite) >= rewriteInterval || !reflect.DeepEqual(last, rules[f]) {
			changed = append(changed, f)
		}
	}
	if len(changed) == 0 {
		return nil
	}
	var errs []error
	if b.lastRules == nil {
		b.lastRules = map[proxy.Family]Rules{}
	}
	for _, f := range changed {
		err := b.red.write(ctx, f, rules[f])
		b.wroteRules(f, err == nil)
		if err != nil {
			b.stats.syncFailures.WithLabelValues(f.String()).Inc()
			errs = append(errs, fmt.Errorf("write the %s redirects (%s): %w", b.red, f, err))
			delete(b.lastRules, f) // unknown: rewrite next time
			continue
		}
		b.lastRules[f] = rules[f]
	}
	if len(changed) == len(fams) {
		b.lastWrite = now
		if len(errs) == 0 {
			b.rulesRemoved.Store(false) // written again after a Cleanup: new UDP sessions are redirected ones
		}
	}
	return errors.Join(errs...)
}

// rewriteInterval bounds how long kp trusts that its table is as it wrote
// it (as the iptables mode's hourly full sync).
const rewriteInterval = time.Hour

// nodePortAddrs is where family f's NodePorts answer, as one list of
// prefixes (an invalid prefix: every local address): --nodeport-addresses,
// "primary" (the Node's IPs), or every local address by default (as
// upstream's iptables mode; the other proxies' userspace modes did too).
// "primary" with no Node IP of f (no Node object, or one without
// addresses) answers on every local address, as the iptables mode does,
// rather than nowhere. b.mu is held.
func (b *Backend) nodePortAddrs(f proxy.Family, node proxy.Node) []netip.Prefix {
	if b.cfg.NodePortPrimary {
		var out []netip.Prefix
		for _, a := range proxy.FilterAddrs(f, node.IPs) {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
		if len(out) > 0 {
			b.warnedPrimary[f] = false
			return out
		}
		if !b.warnedPrimary[f] {
			b.warnedPrimary[f] = true
			b.log.Warn("--nodeport-addresses primary: the Node has no IP of this family yet; NodePorts answer on every local address", "family", f)
		}
		return []netip.Prefix{{}}
	}
	if len(b.cfg.NodePortAddresses) > 0 {
		return proxy.FilterPrefixes(f, b.cfg.NodePortAddresses)
	}
	return []netip.Prefix{{}}
}

// LastRules is what the last Sync wrote for family f.
func (b *Backend) LastRules(f proxy.Family) Rules {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastRules[f]
}
