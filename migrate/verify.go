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

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// VerifyOptions tune VerifyServices. The zero value dials real sockets in
// the process's network namespace.
type VerifyOptions struct {
	Dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	Timeout  time.Duration // per probe; 2 s when zero
	Parallel int           // probes at once; 16 when zero
}

// probe is one ClusterIP of one service port to reach.
type probe struct {
	name   proxy.ServicePortName
	family proxy.Family
	addr   netip.AddrPort
	proto  v1.Protocol
	err    error
}

// VerifyServices proves that backend b carries every Service of st that
// has endpoints usable from this node: it sends a TCP connection or a UDP
// datagram from inside the node to each ClusterIP of each such service port
// and reads b's own per-endpoint counters before and after. A service port
// whose counters for that family moved went through b's rules (a connect
// that succeeded proves only that some path answered: while two modes'
// rules coexist, the one whose NAT chain the kernel consults first wins).
// Real traffic moving the counters proves the same. The error is for what
// stops the check itself (no counters); unproven ports are in Failed.
func VerifyServices(ctx context.Context, st *proxy.State, b proxy.Backend, opts VerifyOptions) (*statusapi.Verification, error) {
	cr, ok := b.(proxy.CounterReporter)
	if !ok {
		return nil, fmt.Errorf("%s mode keeps no per-endpoint counters, so its path cannot be proven", b.Mode())
	}
	if opts.Dial == nil {
		d := &net.Dialer{}
		opts.Dial = d.DialContext
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 16
	}
	v := &statusapi.Verification{}
	probes := probesOf(st, v)
	before, err := cr.EndpointCounters(st)
	if err != nil {
		return nil, fmt.Errorf("read %s counters before the probes: %w", b.Mode(), err)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, opts.Parallel)
	for i := range probes {
		wg.Add(1)
		sem <- struct{}{}
		go func(p *probe) {
			defer func() { <-sem; wg.Done() }()
			p.err = send(ctx, opts, p)
		}(&probes[i])
	}
	wg.Wait()
	v.Probes = len(probes)
	// Counters may lag: a backend may cache its reads (the iptables mode
	// reads at most once a second) or count a proxied connection a little
	// later (userspace). Read again until every probe's moved, or give up
	// after countersWait.
	var after map[proxy.EndpointRef]proxy.EndpointCounter
	deadline := time.Now().Add(countersWait)
	for {
		if after, err = cr.EndpointCounters(st); err != nil {
			return nil, fmt.Errorf("read %s counters after the probes: %w", b.Mode(), err)
		}
		if allMoved(before, after, probes) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	proven := map[proxy.ServicePortName]bool{}
	failed := map[proxy.ServicePortName]bool{}
	for _, p := range probes {
		what := fmt.Sprintf("%s %s %s", p.name, p.proto, p.addr)
		if moved(before, after, p.name, p.family) == 0 {
			failed[p.name] = true
			msg := what + ": the " + string(b.Mode()) + " mode's counters did not move"
			if p.err != nil {
				msg += " (" + p.err.Error() + ")"
			}
			v.Failed = append(v.Failed, msg)
			continue
		}
		proven[p.name] = true
		if p.err != nil {
			v.Warnings = append(v.Warnings, what+": carried by the new mode, but "+p.err.Error())
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

// probesOf lists one probe per ClusterIP of every service port with
// endpoints usable from this node, noting the ones skipped in v.
func probesOf(st *proxy.State, v *statusapi.Verification) []probe {
	var out []probe
	for name, sp := range st.Services {
		if sp.Protocol != v1.ProtocolTCP && sp.Protocol != v1.ProtocolUDP {
			v.Skipped = append(v.Skipped, fmt.Sprintf("%s: %s is not probed", name, sp.Protocol))
			continue
		}
		for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			ips := proxy.FilterAddrs(f, sp.ClusterIPs)
			if len(ips) == 0 {
				continue
			}
			sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f, st.Endpoints[name]), st.Node)
			eps := sel.Cluster
			if sp.InternalPolicyLocal {
				eps = sel.Local
			}
			if len(eps) == 0 {
				v.Skipped = append(v.Skipped, fmt.Sprintf("%s %s: no endpoint usable from this node", name, f))
				continue
			}
			out = append(out, probe{name: name, family: f, proto: sp.Protocol,
				addr: netip.AddrPortFrom(ips[0], uint16(sp.Port))})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].addr.String()+string(out[i].proto) < out[j].addr.String()+string(out[j].proto)
	})
	return out
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

func allMoved(before, after map[proxy.EndpointRef]proxy.EndpointCounter, probes []probe) bool {
	for _, p := range probes {
		if moved(before, after, p.name, p.family) == 0 {
			return false
		}
	}
	return true
}

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
