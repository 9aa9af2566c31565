package userspace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// portState is what a service port contributes to the redirect rules.
type portState struct {
	ports  listenerPorts
	usable bool
	// dropInternal: internalTrafficPolicy Local, and no endpoint on this
	// node: its ClusterIPs' traffic is dropped, as upstream does, not
	// accepted by the listener and held.
	dropInternal bool
	sp           *proxy.ServicePort // its addresses, ports and source ranges
}

// Sync makes the listeners and the redirect table match s. Every sync is
// full: listeners are kept by name, their endpoints replaced, and the
// table rewritten in one transaction per family. It plans first, as data
// (planSync: which service ports keep their listeners, which are
// programmed, which are refused for want of descriptors), then applies the
// plan: listeners opened and updated, rules written, listeners no service
// port wants closed.
func (b *Backend) Sync(ctx context.Context, s *proxy.State) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return errors.New("the userspace proxy is shutting down")
	}
	if b.red == nil {
		return errors.New("the userspace proxy was not probed: no redirect method chosen")
	}
	if b.drift.pending.Swap(false) {
		b.lastRules = nil // another process changed them: rewrite every family
	}
	if !b.expiring {
		b.expiring = true
		go b.expireLoop(ctx)
	}
	nodeIPs := slices.Clone(s.Node.IPs)
	b.nodeIPs.Store(&nodeIPs)
	rl := b.noFile()
	b.setLimits(rl)
	plan := b.planSync(s, rl)
	states, want, errs := b.openListeners(s, plan)
	if err := b.writeChangedRules(ctx, s, plan, states); err != nil {
		errs = append(errs, err)
	}
	// Listeners of service ports that are gone close after the rules no
	// longer send traffic to them; their open connections run on.
	b.closeUnwanted(want)
	b.stats.forget(plan.keep)
	var sockets int
	for _, p := range b.proxies {
		sockets += p.sockets()
	}
	b.listenerSockets.Store(int64(sockets))
	if plan.budgeted {
		b.stats.listenerBudget.Set(float64(plan.budget))
	}
	b.reportRefused(plan.refused, rl, plan.budget)
	// Refused service ports do not fail the sync: the others are
	// programmed, and a failing sync would keep /healthz and /livez failing
	// until the kubelet restarts kp (dropping every proxied connection),
	// for as long as the Services are there. They are reported by the log,
	// kp_userspace_refused_service_ports and Refused, and retried.
	if len(errs) > 0 {
		b.last = nil
		return errors.Join(errs...)
	}
	b.last = make(map[proxy.ServicePortName]portState, len(states))
	for name, st := range states {
		if st.ports == (listenerPorts{}) {
			continue // refused
		}
		b.last[name] = st
	}
	return nil
}

// portAction is what a sync does with one service port's listeners.
type portAction int

const (
	// portKeep: unchanged since the last successful sync; its listeners,
	// balancers and rules stay as they are.
	portKeep portAction = iota
	// portProgram: its listeners are opened (or kept) and given its
	// endpoints.
	portProgram
	// portRefuse: no listener, for want of file descriptors; rejected as
	// a service port without endpoints, so clients fail at once; not in
	// b.last, so retried next sync.
	portRefuse
)

// portPlan is one service port's part of a sync plan.
type portPlan struct {
	action portAction
	last   portState // portKeep: as the last sync left it
}

// syncPlan is what a sync does with the service ports of a State (TCP and
// UDP: Go has no SCTP sockets), decided before any listener opens or
// closes.
type syncPlan struct {
	ports map[proxy.ServicePortName]portPlan
	// program are the portProgram service ports in the order they were
	// admitted to the budget (by name), refused the portRefuse ones.
	program, refused []proxy.ServicePortName
	// keep are the endpoints whose counters stay.
	keep map[proxy.EndpointRef]bool
	// incremental: the last sync succeeded and the Node is the same, so
	// only s.Changed was looked at.
	incremental bool
	// budget is how many sockets the listeners may hold, when budgeted.
	budget   int
	budgeted bool
}

// planSync decides each service port's action. After a successful sync
// only s.Changed needs a look (unless the Node changed: topology and local
// endpoints); the others keep their listeners and balancers as they are.
// Service ports that keep their listeners are counted first, so a new one
// never takes the descriptors of one that works; then new listeners are
// admitted in name order, as the budget allows (fdbudget.go).
func (b *Backend) planSync(s *proxy.State, rl rlimitInfo) *syncPlan {
	p := &syncPlan{ports: map[proxy.ServicePortName]portPlan{}, keep: map[proxy.EndpointRef]bool{},
		incremental: b.last != nil && !s.NodeChanged}
	p.budget, p.budgeted = listenerBudget(rl.cur)
	used := 0
	var pending []proxy.ServicePortName
	for name, sp := range s.Services {
		if sp.Protocol != v1.ProtocolTCP && sp.Protocol != v1.ProtocolUDP {
			continue // SCTP: not proxied (Go has no SCTP sockets)
		}
		for _, e := range s.Endpoints[name] {
			p.keep[ref(name, e.AddrPort())] = true
		}
		have, _ := b.held(name, sp)
		used += have
		if _, changed := s.Changed[name]; p.incremental && !changed {
			if ps, ok := b.last[name]; ok {
				p.ports[name] = portPlan{action: portKeep, last: ps}
				continue
			}
		}
		pending = append(pending, name)
	}
	slices.SortFunc(pending, compareNames)
	for _, name := range pending {
		_, need := b.held(name, s.Services[name])
		if p.budgeted && used+need > p.budget {
			p.ports[name] = portPlan{action: portRefuse}
			p.refused = append(p.refused, name)
			continue
		}
		used += need
		p.ports[name] = portPlan{action: portProgram}
		p.program = append(p.program, name)
	}
	return p
}

// openListeners carries out the plan's listeners. It returns each service
// port's state for the rules (one whose listener failed to open has none,
// and an error), and the listeners wanted: every other one is closed.
func (b *Backend) openListeners(s *proxy.State, p *syncPlan) (map[proxy.ServicePortName]portState, map[proxyKey]bool, []error) {
	states := map[proxy.ServicePortName]portState{}
	want := map[proxyKey]bool{}
	var errs []error
	for name, pp := range p.ports {
		sp := s.Services[name]
		switch pp.action {
		case portKeep:
			st := pp.last
			st.sp = sp
			states[name] = st
			for _, key := range listenerKeys(name, sp) {
				want[key] = true
			}
		case portRefuse:
			states[name] = portState{sp: sp}
		}
	}
	for _, name := range p.program {
		sp, eps := s.Services[name], s.Endpoints[name]
		lp, err := b.programPort(name, sp, eps, s.Node, want)
		if err != nil {
			errs = append(errs, fmt.Errorf("service port %s: %w", name, err))
			continue
		}
		usable, dropInternal := rulesUse(sp, eps, s.Node)
		states[name] = portState{ports: lp, usable: usable, dropInternal: dropInternal, sp: sp}
	}
	return states, want, errs
}

// programPort opens the listeners name lacks, gives each its endpoints and
// marks it wanted; it stops at the first that fails to open.
func (b *Backend) programPort(name proxy.ServicePortName, sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node, want map[proxyKey]bool) (listenerPorts, error) {
	var lp listenerPorts
	for _, key := range listenerKeys(name, sp) {
		p, err := b.ensure(key, sp.Protocol)
		if err != nil {
			return listenerPorts{}, err
		}
		want[key] = true
		b.update(p, sp, eps, node, key.external)
		if key.external {
			lp.external = p.port()
		} else {
			lp.internal = p.port()
		}
	}
	return lp, nil
}

// rulesUse is what a service port's rules need besides its listener ports:
// whether an endpoint is usable, and whether its ClusterIPs' traffic is
// dropped (internalTrafficPolicy Local without an endpoint on this node).
func rulesUse(sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node) (usable, dropInternal bool) {
	local := false
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f, eps), node)
		usable = usable || sel.Usable
		local = local || len(sel.Local) > 0
	}
	return usable, sp.InternalPolicyLocal && usable && !local
}

// writeChangedRules writes the redirect rules unless an incremental sync
// changed nothing they depend on, both families are known and the last
// write is younger than rewriteInterval.
func (b *Backend) writeChangedRules(ctx context.Context, s *proxy.State, p *syncPlan, states map[proxy.ServicePortName]portState) error {
	rulesSame := p.incremental && !s.ServiceCIDRsChanged && !b.listeningAgain(states) && !b.rulesChanged(s, states)
	if rulesSame && len(b.lastRules) == len(b.red.families()) && b.now().Sub(b.lastWrite) < rewriteInterval {
		return nil // nothing to write
	}
	return b.writeRules(ctx, s, states)
}

// closeUnwanted stops and forgets every listener not in want.
func (b *Backend) closeUnwanted(want map[proxyKey]bool) {
	for key, p := range b.proxies {
		if !want[key] {
			p.stop()
			delete(b.proxies, key)
		}
	}
}

// rulesChanged reports whether a changed service port's rules differ from
// the last sync's. The rules change only with a service port's Service
// (addresses, ports, source ranges), listener ports or usability, or a
// service port coming or going: endpoint changes, the most common, leave
// them.
func (b *Backend) rulesChanged(s *proxy.State, states map[proxy.ServicePortName]portState) bool {
	for name := range s.Changed {
		old, had := b.last[name]
		st, has := states[name]
		if had != has || old.ports != st.ports || old.usable != st.usable || old.dropInternal != st.dropInternal ||
			has && !reflect.DeepEqual(old.sp, s.Services[name]) {
			return true
		}
	}
	return false
}

// update gives p the endpoints its traffic may use: SelectEndpoints per
// family, the Local list for traffic under a Local policy.
func (b *Backend) update(p portProxy, sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node, external bool) {
	local := sp.InternalPolicyLocal
	if external {
		local = sp.ExternalPolicyLocal
	}
	bal := p.balancers()
	split := external && local
	valid := map[netip.AddrPort]bool{}
	set := func(target *balancer, list []proxy.Endpoint) {
		aps := make([]netip.AddrPort, 0, len(list))
		for _, e := range list {
			aps = append(aps, e.AddrPort())
			valid[e.AddrPort()] = true
		}
		target.update(aps, sp.AffinityTimeout)
	}
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f, eps), node)
		list := sel.Cluster
		if local {
			list = sel.Local
		}
		set(bal.of(familyAddr(f)), list)
		if split {
			set(bal.clusterOf(familyAddr(f)), sel.Cluster)
		} else {
			bal.clusterOf(familyAddr(f)).update(nil, 0)
		}
	}
	bal.split.Store(split)
	if u, ok := p.(*udpProxy); ok {
		u.prune(valid)
	}
}

// familyAddr is an address of family f (to choose a family's balancer).
func familyAddr(f proxy.Family) netip.Addr {
	if f == proxy.IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}
