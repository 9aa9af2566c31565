package userspace

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// The userspace mode holds a listener per service port, so the number of
// Services decides how many file descriptors it takes, and RLIMIT_NOFILE
// bounds it. Without a budget, the listeners of a big cluster take every
// descriptor and then everything else fails with EMFILE: the redirect
// writer's netlink socket too, so no Service at all is programmed, and no
// connection can be proxied (measured: test/bench/NOTES.md, "kp-userspace
// did not finish at 30,000"). So the limit is split three ways:
//
//   - fdReserve, a fixed number, is kp's own whatever the Services: the Go
//     runtime (epoll, its pipe), stdio, the API client's connections, the
//     health and metrics servers and their clients, healthCheckNodePort
//     listeners, netlink sockets (the redirect writer, conntrack cleanup,
//     kp top's streams), iptables-restore's pipes, /proc reads, with room
//     for bursts (test/bench/NOTES.md has what a small kp holds).
//   - a quarter of the limit is for proxied connections (2 descriptors a
//     TCP connection, 1 a UDP session): the listeners may never take it,
//     so Services over the limit cannot starve the traffic of the ones
//     programmed.
//   - the rest is the listeners' budget (listenerBudget). Service ports past
//     it are refused (their traffic rejected, as a Service without
//     endpoints) and retried at every sync.
//
// Connections may also use what the listeners leave unused, but never
// fdReserve (fdRoom).
const (
	fdReserve       = 256
	fdConnShareDivs = 4 // a 1/fdConnShareDivs share of the limit
)

// listenerBudget is how many sockets the listeners may hold under a
// RLIMIT_NOFILE of limit; false when the limit is unknown (no budget).
func listenerBudget(limit uint64) (int, bool) {
	if limit == 0 {
		return 0, false
	}
	keep := fdReserve + limit/fdConnShareDivs
	if limit <= keep {
		return 0, true
	}
	return int(limit - keep), true
}

// fdRoom reports whether a new connection may take n more descriptors:
// the listeners' sockets and the open connections' plus n stay below the
// limit less fdReserve, so that kp's own sockets (the redirect writer's
// netlink socket above all) still open when connections are many.
func (b *Backend) fdRoom(n int) bool {
	rl := b.limits()
	if rl.cur == 0 || rl.cur <= fdReserve {
		return true // unknown, or too low to split: let the kernel say
	}
	return b.listenerSockets.Load()+int64(b.conns.len()+n) <= int64(rl.cur-fdReserve)
}

// socketsFor is what a new listener of protocol holds: TCP one socket
// (dual-stack), UDP two (an IPv4 and an IPv6 socket).
func socketsFor(protocol v1.Protocol) int {
	if protocol == v1.ProtocolUDP {
		return 2
	}
	return 1
}

// listenerKeys are the listeners service port sp needs: internal traffic,
// and external traffic when it has some.
func listenerKeys(name proxy.ServicePortName, sp *proxy.ServicePort) []proxyKey {
	keys := []proxyKey{{name: name}}
	if sp.HasExternal() {
		keys = append(keys, proxyKey{name: name, external: true})
	}
	return keys
}

// held is how many sockets sp's listeners hold now (those of its
// protocol: one of another protocol is closed before its replacement
// opens), and how many more opening the missing ones would take.
func (b *Backend) held(name proxy.ServicePortName, sp *proxy.ServicePort) (have, need int) {
	for _, key := range listenerKeys(name, sp) {
		if p := b.proxies[key]; p != nil && p.protocol() == sp.Protocol {
			have += p.sockets()
			continue
		}
		need += socketsFor(sp.Protocol)
	}
	return have, need
}

// compareNames orders service ports by namespace, name, port name and
// protocol: the order in which new listeners are admitted, so the same
// ones are refused at every sync and after a restart.
func compareNames(a, b proxy.ServicePortName) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name),
		strings.Compare(a.Port, b.Port), strings.Compare(string(a.Protocol), string(b.Protocol)))
}

// listeningAgain reports whether a service port the last sync refused has a
// listener now: not in s.Changed, it still changes the rules.
func (b *Backend) listeningAgain(states map[proxy.ServicePortName]portState) bool {
	for _, name := range b.refused {
		if _, ok := b.last[name]; !ok && states[name].ports != (listenerPorts{}) {
			return true
		}
	}
	return false
}

// RefusedError names the service ports a sync gave no listener because
// the listeners' budget of file descriptors was spent.
type RefusedError struct {
	ServicePorts []proxy.ServicePortName // sorted
	Limit, Hard  uint64                  // RLIMIT_NOFILE, soft and hard
	Budget       int                     // sockets the listeners may hold
}

// refusedNamed bounds how many names the message lists (the metric and
// Refused have them all).
const refusedNamed = 20

func (e *RefusedError) Error() string {
	names := make([]string, 0, min(len(e.ServicePorts), refusedNamed))
	for _, n := range e.ServicePorts[:min(len(e.ServicePorts), refusedNamed)] {
		names = append(names, n.String())
	}
	list := strings.Join(names, ", ")
	if more := len(e.ServicePorts) - len(names); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	return fmt.Sprintf("%d service ports refused (no listener; their traffic is rejected): %s: "+
		"RLIMIT_NOFILE is %d (hard limit %d) and the listeners may hold %d sockets of it "+
		"(%d descriptors and a quarter of the limit are kept for kp itself and proxied connections); "+
		"raise the limit (ulimit -n, systemd LimitNOFILE=, the container runtime's nofile ulimit) "+
		"and they are programmed at the next sync",
		len(e.ServicePorts), list, e.Limit, e.Hard, e.Budget, fdReserve)
}

// reportRefused logs the refused service ports when they differ from the
// last sync's, and sets the metric.
func (b *Backend) reportRefused(refused []proxy.ServicePortName, rl rlimitInfo, budget int) {
	b.stats.refusedPorts.Set(float64(len(refused)))
	same := slices.Equal(refused, b.refused)
	b.refused = refused
	if len(refused) == 0 {
		if !same {
			b.log.Info("every service port has a listener again", "RLIMIT_NOFILE", rl.cur, "hardLimit", rl.max)
		}
		return
	}
	err := &RefusedError{ServicePorts: refused, Limit: rl.cur, Hard: rl.max, Budget: budget}
	if same {
		b.log.Debug("service ports still refused for want of file descriptors", "refused", len(refused))
		return
	}
	b.log.Error("out of file descriptors for listeners: service ports refused", "refused", len(refused),
		"limit", rl.cur, "hardLimit", rl.max, "listenerBudget", budget, "err", err)
}

// Refused returns the service ports the last sync refused for want of
// file descriptors (nil when none), as a RefusedError.
func (b *Backend) Refused() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.refused) == 0 {
		return nil
	}
	rl := b.limits()
	budget, _ := listenerBudget(rl.cur)
	return &RefusedError{ServicePorts: slices.Clone(b.refused), Limit: rl.cur, Hard: rl.max, Budget: budget}
}

// fdRefused resets or drops a new connection (TCP) or session (UDP) that
// fdRoom turned away, counts it, and says why at most every fdLogEvery.
func (b *Backend) fdRefused(name proxy.ServicePortName, protocol string) {
	b.stats.refused.WithLabelValues(protocol).Inc()
	now := b.now().UnixNano()
	last := b.fdLogged.Load()
	if now-last < int64(fdLogEvery) || !b.fdLogged.CompareAndSwap(last, now) {
		return
	}
	rl := b.limits()
	b.log.Error("file descriptors short: new connections refused to keep kp's reserve",
		"servicePort", name.String(), "protocol", protocol, "limit", rl.cur, "hardLimit", rl.max,
		"reserve", fdReserve, "listenerSockets", b.listenerSockets.Load(), "connectionSockets", b.conns.len())
}

// fdLogEvery bounds the log lines of refused connections.
const fdLogEvery = 10 * time.Second

// fdError logs a socket error, saying so clearly when the process is out
// of file descriptors.
func (b *Backend) fdError(name proxy.ServicePortName, err error) {
	if isFDExhausted(err) {
		rl := b.limits()
		b.log.Error("out of file descriptors: new connections fail", "servicePort", name.String(),
			"limit", rl.cur, "hardLimit", rl.max, "err", err)
		return
	}
	b.log.Debug("socket error", "servicePort", name.String(), "err", err)
}

func (b *Backend) fdHint(err error) error {
	if isFDExhausted(err) {
		rl := b.limits()
		return fmt.Errorf("%w (out of file descriptors: RLIMIT_NOFILE is %d, hard limit %d; raise the hard limit, e.g. LimitNOFILE= or the container runtime's ulimit)",
			err, rl.cur, rl.max)
	}
	return err
}

func isFDExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
