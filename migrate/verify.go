package migrate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/nft"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// VerifyOptions tune VerifyServices. The zero value dials real sockets in
// the process's network namespace and expects NodePorts on every local
// address.
type VerifyOptions struct {
	Dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	Timeout  time.Duration // per probe; 2 s when zero
	Parallel int           // probes at once; 16 when zero
	// NodePorts is where the mode answers NodePorts by its settings.
	NodePorts NodePortScope
	// LocalAddrs lists the node's addresses (proxy.LocalAddrs when nil);
	// DefaultRouteAddrs those of the interfaces holding a default route
	// (nft.DefaultRouteAddrs when nil).
	LocalAddrs, DefaultRouteAddrs func() ([]netip.Addr, error)
}

// VerifyServices proves that backend b carries every Service of st that
// has endpoints usable from this node, on every kind of address the node
// serves it on (probesOf): the first ClusterIP, the NodePort on each
// NodePort address of the node, each externalIP and LoadBalancer IP. It
// sends a TCP connection or a UDP datagram from inside the node to each,
// and reads b's own per-endpoint counters before and after: an address
// whose service port's counters for that family moved went through b's
// rules (a connect that succeeded proves only that some path answered:
// while two modes' rules coexist, the one whose NAT chain the kernel
// consults first wins). A mode counts per endpoint, not per address, so
// the probes go in rounds, one address of each service port and family a
// round, counters read between rounds (real traffic to the same service
// port in the same round proves it as well).
//
// The probes leave the node's own stack, so they traverse the nat OUTPUT
// hook, never PREROUTING (a packet the node sends itself gets its NAT
// binding at OUTPUT; looped back, PREROUTING's nat chains are not
// consulted again), which an off-node client's packets traverse. That
// proves what a switch programs because every mode writes each
// Service's state once, in objects both hooks reach: nftables mode's
// nat-prerouting and nat-output chains both jump to its services chain
// (NodePorts: its nodeport-ips set and service-nodeports map); the
// iptables mode's PREROUTING and OUTPUT both jump to KP-SERVICES (NodePorts:
// KP-NODEPORTS); the userspace mode writes one rule list into both its
// prerouting and output chains (NodePorts: one nodeport-redirects map),
// or with iptables jumps from both to KP-USERSPACE-PORTALS; the ipvs
// mode's virtual servers are looked up by IPVS both for packets arriving
// and for the node's own. Only the static hook rules are left unproven,
// and they are the ones a kp started in that mode writes (measured:
// test/proofs/t32a.md).
//
// The error is for what stops the check itself (no counters, no list of
// local addresses); unproven addresses are in Failed.
func VerifyServices(ctx context.Context, st *proxy.State, b proxy.Backend, opts VerifyOptions) (*statusapi.Verification, error) {
	cr, ok := b.(proxy.CounterReporter)
	if !ok {
		return nil, fmt.Errorf("%s mode keeps no per-endpoint counters, so its path cannot be proven", b.Mode())
	}
	opts = opts.withDefaults()
	node := nodeAddrs{scope: opts.NodePorts}
	var err error
	if node.local, err = opts.LocalAddrs(); err != nil {
		return nil, fmt.Errorf("list the node's addresses for its NodePorts: %w", err)
	}
	v4, v6 := proxy.FilterAddrs(proxy.IPv4, st.Node.IPs), proxy.FilterAddrs(proxy.IPv6, st.Node.IPs)
	if node.scope.Primary && (len(v4) == 0 || len(v6) == 0) { // a family without a Node IP
		if node.defaultRoute, err = opts.DefaultRouteAddrs(); err != nil {
			return nil, fmt.Errorf("list the default route's addresses for the node's NodePorts: %w", err)
		}
	}
	v := &statusapi.Verification{Addresses: map[string]int{}}
	var probes []probe
	probes, v.Skipped = probesOf(st, node)
	before, err := cr.EndpointCounters(st)
	if err != nil {
		return nil, fmt.Errorf("read %s counters before the probes: %w", b.Mode(), err)
	}
	// A service port and family that failed an address is not carried:
	// its later addresses are not probed (each failed round waits
	// countersWait, and a shadowed mode fails them all).
	type group struct {
		name   proxy.ServicePortName
		family proxy.Family
	}
	failedGroup := map[group]bool{}
	for _, round := range rounds(probes) {
		var send []*probe
		for _, p := range round {
			if failedGroup[group{p.name, p.family}] {
				p.skipped = true
				v.Skipped = append(v.Skipped, p.String()+": not probed, an earlier address of it was not carried")
				continue
			}
			send = append(send, p)
		}
		if before, err = probeRound(ctx, opts, cr, st, before, send); err != nil {
			return nil, fmt.Errorf("read %s counters after the probes: %w", b.Mode(), err)
		}
		for _, p := range send {
			if !p.moved {
				failedGroup[group{p.name, p.family}] = true
			}
		}
	}
	proven := map[proxy.ServicePortName]bool{}
	failed := map[proxy.ServicePortName]bool{}
	for _, p := range probes {
		if p.skipped {
			continue
		}
		v.Probes++
		v.Addresses[string(p.kind)]++
		if !p.moved {
			failed[p.name] = true
			msg := p.String() + ": the " + string(b.Mode()) + " mode's counters did not move"
			if p.err != nil {
				msg += " (" + p.err.Error() + ")"
			}
			v.Failed = append(v.Failed, msg)
			continue
		}
		proven[p.name] = true
		if p.err != nil {
			v.Warnings = append(v.Warnings, p.String()+": carried by the new mode, but "+p.err.Error())
		}
	}
	for n := range proven {
		if !failed[n] {
			v.ServicePorts++
		}
	}
	sort.Strings(v.Failed)
	sort.Strings(v.Warnings)
	sort.Strings(v.Skipped)
	return v, nil
}

func (o VerifyOptions) withDefaults() VerifyOptions {
	if o.Dial == nil {
		d := &net.Dialer{}
		o.Dial = d.DialContext
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Parallel <= 0 {
		o.Parallel = 16
	}
	if o.LocalAddrs == nil {
		o.LocalAddrs = proxy.LocalAddrs
	}
	if o.DefaultRouteAddrs == nil {
		o.DefaultRouteAddrs = nft.DefaultRouteAddrs
	}
	return o
}

// probeRound sends a round's probes at once and marks each whose service
// port's counters of its family moved from before. Counters may lag: a
// backend may cache its reads (the iptables mode reads at most once a
// second) or count a proxied connection a little later (userspace), so
// they are read again until every probe's moved, or countersWait passed.
// It returns the counters last read, the next round's before.
func probeRound(ctx context.Context, opts VerifyOptions, cr proxy.CounterReporter, st *proxy.State,
	before map[proxy.EndpointRef]proxy.EndpointCounter, round []*probe) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, opts.Parallel)
	for _, p := range round {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			p.err = send(ctx, opts, p)
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(countersWait)
	for {
		after, err := cr.EndpointCounters(st)
		if err != nil {
			return nil, err
		}
		all := true
		for _, p := range round {
			p.moved = moved(before, after, p.name, p.family) > 0
			all = all && p.moved
		}
		if all || time.Now().After(deadline) {
			return after, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// send opens one TCP connection, or sends one UDP datagram and waits
// briefly for an answer (a UDP service need not answer: the counters are
// the proof).
func send(ctx context.Context, opts VerifyOptions, p *probe) error {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	network := "tcp"
	if p.proto == v1.ProtocolUDP {
		network = "udp"
	}
	c, err := opts.Dial(ctx, network, p.addr.String())
	if err != nil {
		return err
	}
	defer c.Close()
	if network == "tcp" {
		return nil
	}
	if _, err := c.Write([]byte("kp migrate: verify\n")); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(opts.Timeout / 4))
	var buf [512]byte
	if _, err := c.Read(buf[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return err
	}
	return nil
}

// countersWait bounds how long VerifyServices waits for counters to show
// its probes.
const countersWait = 3 * time.Second

// moved sums how much the counters of a service port's endpoints of
// family f grew.
func moved(before, after map[proxy.EndpointRef]proxy.EndpointCounter, name proxy.ServicePortName, f proxy.Family) uint64 {
	var n uint64
	for ref, c := range after {
		if ref.ServicePort != name || !f.Has(ref.Endpoint.Addr()) {
			continue
		}
		if b := before[ref].Packets; c.Packets > b {
			n += c.Packets - b
		}
	}
	return n
}
