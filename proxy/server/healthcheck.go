package server

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kpproxy/kp/proxy"
	"k8s.io/apimachinery/pkg/types"
)

// ServiceHealthServer serves the healthCheckNodePort of every Service of type
// LoadBalancer with externalTrafficPolicy Local, as upstream kube-proxy's
// service health server does: cloud load balancers probe it to send external
// traffic only to nodes that have an endpoint of the Service. It answers 200
// when this node has at least one ready endpoint of the Service and the proxy
// is healthy, 503 otherwise, with upstream's JSON body.
//
// Like upstream (one server per IP family), each of the Service's families
// gets its own listeners (tcp4, tcp6), and the count it reports is the
// number of distinct local ready endpoint addresses of that family.
type ServiceHealthServer struct {
	log *slog.Logger
	// healthy is the proxy's own health (serviceProxyHealthy).
	healthy func() bool
	// addrs picks where a family's listeners bind, from the node.
	addrs func(f proxy.Family, node proxy.Node) []netip.Addr
	// listen is net.Listen in production; tests may inject failures.
	listen func(network, addr string) (net.Listener, error)

	mu        sync.RWMutex
	instances map[hcKey]*hcInstance
	// failed remembers, per Service family, the listen error last logged,
	// so a port in use is logged once, not at every sync.
	failed map[hcKey]string
	// withPort keeps the ports with a health check port, so that a sync
	// does not walk every Service to find the few.
	withPort *proxy.PortSet
	// closed is set by Close: the sync loop may still run a last Sync
	// while the proxy shuts down, which must not open ports again.
	closed bool
}

type hcKey struct {
	Service types.NamespacedName
	Family  proxy.Family
}

type hcInstance struct {
	port      int32
	addrs     []netip.Addr
	servers   []*http.Server
	endpoints int
}

// ServiceHealthOptions configures a ServiceHealthServer.
type ServiceHealthOptions struct {
	Log *slog.Logger
	// Healthy reports the proxy's health; nil means always healthy.
	Healthy func() bool
	// NodePortAddresses and NodePortPrimary are --nodeport-addresses:
	// listeners bind the node's addresses inside these CIDRs, or its
	// primary IPs; a family with neither binds the wildcard address.
	NodePortAddresses []netip.Prefix
	NodePortPrimary   bool
	// NodePortScope, when set, is read at every Sync instead: the running
	// mode's --nodeport-addresses (a switch may change them).
	NodePortScope func() ([]netip.Prefix, bool)
	// InterfaceAddrs lists the node's local addresses (for CIDRs); nil
	// means the host's interfaces.
	InterfaceAddrs func() ([]netip.Addr, error)
	// Listen is net.Listen when nil.
	Listen func(network, addr string) (net.Listener, error)
}

// NewServiceHealthServer returns a server with no listener open; Sync opens
// them.
func NewServiceHealthServer(o ServiceHealthOptions) *ServiceHealthServer {
	s := &ServiceHealthServer{
		log:       o.Log,
		healthy:   o.Healthy,
		listen:    o.Listen,
		instances: make(map[hcKey]*hcInstance),
		failed:    make(map[hcKey]string),
		withPort:  proxy.NewPortSet(hasHealthCheck),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.healthy == nil {
		s.healthy = func() bool { return true }
	}
	if s.listen == nil {
		s.listen = net.Listen
	}
	ifAddrs := o.InterfaceAddrs
	if ifAddrs == nil {
		ifAddrs = proxy.LocalAddrs
	}
	scope := o.NodePortScope
	if scope == nil {
		scope = func() ([]netip.Prefix, bool) { return o.NodePortAddresses, o.NodePortPrimary }
	}
	s.addrs = func(f proxy.Family, node proxy.Node) []netip.Addr {
		cidrs, primary := scope()
		return healthCheckAddrs(f, node, cidrs, primary, ifAddrs, s.log)
	}
	return s
}

// healthCheckAddrs is where upstream's service health server listens for
// family f: with --nodeport-addresses primary, the node's primary IP of f;
// with CIDRs, every local address of f inside them; the wildcard address
// when the setting names nothing of f (or lists a zero CIDR).
func healthCheckAddrs(f proxy.Family, node proxy.Node, cidrs []netip.Prefix, primary bool, ifAddrs func() ([]netip.Addr, error), log *slog.Logger) []netip.Addr {
	wildcard := []netip.Addr{netip.IPv4Unspecified()}
	if f == proxy.IPv6 {
		wildcard = []netip.Addr{netip.IPv6Unspecified()}
	}
	if primary {
		if ip, ok := node.PrimaryIP(f); ok && !ip.IsLoopback() {
			return []netip.Addr{ip}
		}
		return wildcard
	}
	mine := proxy.FilterPrefixes(f, cidrs)
	if len(mine) == 0 || slices.ContainsFunc(mine, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return wildcard
	}
	local, err := ifAddrs()
	if err != nil {
		// Upstream falls back to every address too.
		log.Error("cannot list local addresses; health check ports listen on all addresses", "error", err.Error())
		return wildcard
	}
	var out []netip.Addr
	for _, a := range local {
		if slices.ContainsFunc(mine, func(p netip.Prefix) bool { return p.Contains(a) }) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Sync opens and closes listeners so that exactly the Services of s with a
// healthCheckNodePort are served, and updates their local endpoint counts.
// A port that cannot be opened (in use, say) is logged with the Service's
// name and retried at the next Sync; it never fails the proxy.
func (s *ServiceHealthServer) Sync(st *proxy.State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	want, counts := healthChecks(st, s.withPort.Update(st))
	if s.closed {
		return
	}
	for key, inst := range s.instances {
		w, ok := want[key]
		if ok && w == inst.port && slices.Equal(inst.addrs, s.addrs(key.Family, st.Node)) {
			continue
		}
		s.log.Info("closing health check port", "service", key.Service.String(), "family", key.Family.String(), "port", inst.port)
		inst.close()
		delete(s.instances, key)
	}
	for key := range s.failed {
		if _, ok := want[key]; !ok {
			delete(s.failed, key)
		}
	}
	for _, key := range slices.SortedFunc(maps.Keys(want), compareHCKeys) {
		if s.instances[key] != nil {
			continue
		}
		inst, err := s.open(key, want[key], s.addrs(key.Family, st.Node))
		if err != nil {
			if s.failed[key] != err.Error() {
				s.log.Error("cannot open health check port; will retry at the next sync", "service", key.Service.String(),
					"family", key.Family.String(), "port", want[key], "error", err.Error())
				s.failed[key] = err.Error()
			}
			continue
		}
		delete(s.failed, key)
		s.instances[key] = inst
	}
	for key, inst := range s.instances {
		inst.endpoints = counts[key]
	}
}

// hasHealthCheck is true for a port with a health check node port.
func hasHealthCheck(sp *proxy.ServicePort) bool { return sp.HealthCheckNodePort != 0 }

// healthChecks lists the health check port of every Service family of st,
// and the number of distinct local ready endpoint addresses of each. names
// lists st's ports with a health check port.
func healthChecks(st *proxy.State, names iter.Seq[proxy.ServicePortName]) (ports map[hcKey]int32, counts map[hcKey]int) {
	ports = make(map[hcKey]int32)
	local := make(map[hcKey]map[netip.Addr]struct{})
	for name := range names {
		sp := st.Services[name]
		for _, ip := range sp.ClusterIPs {
			key := hcKey{Service: name.NamespacedName, Family: proxy.FamilyOf(ip)}
			ports[key] = sp.HealthCheckNodePort
			if local[key] == nil {
				local[key] = make(map[netip.Addr]struct{})
			}
			for _, ep := range st.Endpoints[name] {
				// Only ready endpoints: a node left with terminating
				// ones must fail the check so the balancer drains it.
				if ep.Ready && ep.NodeName() == st.Node.Name && key.Family.Has(ep.IP) {
					local[key][ep.IP] = struct{}{}
				}
			}
		}
	}
	counts = make(map[hcKey]int, len(local))
	for key, ips := range local {
		counts[key] = len(ips)
	}
	return ports, counts
}

func (s *ServiceHealthServer) open(key hcKey, port int32, addrs []netip.Addr) (*hcInstance, error) {
	inst := &hcInstance{port: port, addrs: addrs}
	network := "tcp4"
	if key.Family == proxy.IPv6 {
		network = "tcp6"
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("no local address matches --nodeport-addresses for %s", key.Family)
	}
	for _, a := range addrs {
		addr := netip.AddrPortFrom(a, uint16(port)).String()
		ln, err := s.listen(network, addr)
		if err != nil {
			inst.close()
			return nil, err
		}
		srv := &http.Server{Handler: s.handler(key), ReadHeaderTimeout: 10 * time.Second}
		inst.servers = append(inst.servers, srv)
		s.log.Info("serving health check port", "service", key.Service.String(), "address", ln.Addr().String())
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("health check port stopped", "service", key.Service.String(), "address", addr, "error", err.Error())
			}
		}()
	}
	return inst, nil
}

func (inst *hcInstance) close() {
	for _, srv := range inst.servers {
		_ = srv.Close()
	}
}

// Close closes every listener for good.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for key, inst := range s.instances {
		inst.close()
		delete(s.instances, key)
	}
}

// LocalEndpoints returns the count a Service family's health check reports,
// and whether it is served.
func (s *ServiceHealthServer) LocalEndpoints(svc types.NamespacedName, f proxy.Family) (int, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	inst := s.instances[hcKey{Service: svc, Family: f}]
	if inst == nil {
		return 0, false
	}
	return inst.endpoints, true
}

func (s *ServiceHealthServer) handler(key hcKey) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		count, ok := s.LocalEndpoints(key.Service, key.Family)
		healthy := s.healthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		if ok && count > 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, serviceHealthBody(key.Service, count, healthy))
	})
}

// serviceHealthBody is upstream's response body, byte for byte (tabs and
// all): some operators' probes match on it.
func serviceHealthBody(svc types.NamespacedName, count int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		svc.Namespace, svc.Name, count, healthy)
}

func compareHCKeys(a, b hcKey) int {
	return cmp.Or(cmp.Compare(a.Service.Namespace, b.Service.Namespace),
		cmp.Compare(a.Service.Name, b.Service.Name), cmp.Compare(a.Family, b.Family))
}
