package bench

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
)

// Workload shape: every Service has one TCP port and endpointsPer ready
// endpoints. Endpoints live at fake addresses in 172.16.0.0/12 (no route
// leads anywhere from the node: its default route is the client, which
// does not forward), except the sampled Services', which point at the
// current world's real pods.
const (
	namespace    = "bench"
	endpointsPer = 10
	servicePort  = 80
	podPort      = 8080
)

// cluster is the one API server every proxy of the run reads, populated
// once per N and reused: only the proxies are restarted.
type cluster struct {
	t   *testing.T
	srv *apiserver.Server
	api kubernetes.Interface

	mu         sync.Mutex
	clusterIPs []string // by Service index
	// endpoints are the addresses the run last wrote for a Service (absent:
	// its fake endpoints), rolled how many of them a churn replaced (c.mu).
	endpoints map[int][]string
	rolled    map[int]int
	changes   atomic.Int64
	// churnAddrs and churnSvcs number the churn phases' endpoint addresses
	// and Services over the run.
	churnAddrs atomic.Uint32
	churnSvcs  atomic.Int64
}

// serviceRange is the run's IPv4 Service range: a /12, the largest the
// API server takes, since 100,000 Services do not fit in the worlds' /16
// (netns.ServiceCIDR). It is outside 10.0.0.0/8, where the worlds' nodes
// and pods live (a Service range holding them would have the proxies drop
// traffic to them as unallocated Service addresses), and outside the fake
// endpoints' 172.16.0.0/12. newWorld routes it from the client to the node.
var serviceRange = netip.MustParsePrefix("100.64.0.0/12")

// serverOptions are the run's API server's, on the etcd seed dir if any
// (a seed is made with the same Service ranges).
func serverOptions(seed string) apiserver.Options {
	return apiserver.Options{EtcdSeed: seed, ServiceCIDRs: []netip.Prefix{serviceRange, netns.ServiceCIDR6}}
}

// newCluster starts the run's API server, on the etcd seed -bench.seed
// names if any.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterWith(t, serverOptions(*flagSeed))
}

// newClusterWith starts an API server with opts; on a seed, it adopts the
// seed's Services.
func newClusterWith(t *testing.T, opts apiserver.Options) *cluster {
	t.Helper()
	srv := apiserver.Start(t, opts)
	cfg := srv.Instance(0).Config(srv.AdminToken())
	// Populating tens of thousands of objects: the default 100 QPS would
	// make the client, not the server, the bottleneck.
	cfg.QPS, cfg.Burst = 5000, 5000
	// Protobuf costs the API server less per object than JSON, and the
	// population is the API server's CPU.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	api, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("API client: %v", err)
	}
	c := &cluster{t: t, srv: srv, api: api}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := api.CoreV1().Namespaces().Create(ctx(t), ns, metav1.CreateOptions{}); err != nil {
		if opts.EtcdSeed == "" || !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", namespace, err)
		}
	}
	if opts.EtcdSeed != "" {
		c.adopt()
	}
	return c
}

// ctx bounds one API call.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func serviceName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// fakeEndpoint is endpoint j of Service i: 172.16.0.0 + 10i + j.
func fakeEndpoint(i, j int) string {
	v := uint32(172<<24|16<<16) + uint32(i*endpointsPer+j)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// grow adds Services (and their slices) until there are n, straight into
// the API server's etcd (fill: the API server's own create path is
// quadratic), and returns how long it took, until the API server served
// them all.
func (c *cluster) grow(n int) time.Duration {
	c.t.Helper()
	start := time.Now()
	c.mu.Lock()
	have := len(c.clusterIPs)
	if n > have {
		c.clusterIPs = append(c.clusterIPs, make([]string, n-have)...)
	}
	c.mu.Unlock()
	if n > have {
		if err := c.fill(have, n); err != nil {
			c.t.Fatalf("populate %d Services: %v", n, err)
		}
	}
	return time.Since(start)
}

// slice is Service i's one EndpointSlice with addrs, stamped with the
// trigger time the endpointslice controller would set.
func slice(i int, addrs []string) *discovery.EndpointSlice {
	name := serviceName(i)
	ready := true
	sl := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Labels:      map[string]string{discovery.LabelServiceName: name},
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports: []discovery.EndpointPort{{
			Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(podPort)),
		}},
	}
	for _, a := range addrs {
		sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{
			Addresses: []string{a}, Conditions: discovery.EndpointConditions{Ready: &ready},
		})
	}
	return sl
}

func ptr[T any](v T) *T { return &v }

// setEndpoints replaces Service i's endpoints with addrs. It reads the slice
// first and returns once the update is sent and acknowledged; sent is the
// time the update was sent, after the read.
func (c *cluster) setEndpoints(i int, addrs []string) (sent time.Time, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	slices := c.api.DiscoveryV1().EndpointSlices(namespace)
	cur, err := slices.Get(ctx, serviceName(i), metav1.GetOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("get EndpointSlice %s/%s: %w", namespace, serviceName(i), err)
	}
	next := slice(i, addrs)
	next.ResourceVersion = cur.ResourceVersion
	sent = time.Now()
	if _, err := slices.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		return sent, fmt.Errorf("update EndpointSlice %s/%s: %w", namespace, serviceName(i), err)
	}
	return sent, nil
}

// samples are the Services whose endpoints are real pods: spread over the
// index range, so both the first and the last written are checked.
func samples(n int) []int {
	s := []int{0, n / 4, n / 2, 3 * n / 4, n - 1}
	slices.Sort(s)
	return slices.Compact(s)
}

// pointSamples makes the sampled Services' endpoints the world's pods.
func (c *cluster) pointSamples(w *netns.World, n int) {
	c.t.Helper()
	var addrs []string
	for _, p := range w.Pods() {
		addrs = append(addrs, p.IP.String())
	}
	for _, i := range samples(n) {
		if _, err := c.setEndpoints(i, addrs); err != nil {
			c.t.Fatalf("point sample Service at the pods: %v", err)
		}
	}
}

// changeTarget is the Service the k-th incremental change edits: spread
// over the range, never a sample (those must keep answering).
func changeTarget(k, n int) int { return spreadTarget(k, n, 13) }

// spreadTarget is the k-th of a walk over n Services by a prime stride
// from offset, past the samples (changeTarget's and churnTarget's).
func spreadTarget(k, n, offset int) int {
	s := samples(n)
	i := (k*7919 + offset) % n
	for slices.Contains(s, i) {
		i = (i + 1) % n
	}
	return i
}

// changeOne replaces the first endpoint of Service i with a fresh address
// (198.18.0.0/15, the benchmarking range: the fake endpoints of 100,000
// Services reach 172.31.66.63) and returns when the write was sent.
func (c *cluster) changeOne(i int) (time.Time, error) {
	k := c.changes.Add(1)
	addrs := make([]string, endpointsPer)
	for j := range addrs {
		addrs[j] = fakeEndpoint(i, j)
	}
	addrs[0] = fmt.Sprintf("198.%d.%d.%d", 18+(k>>16)&1, (k>>8)&255, k&255)
	c.mu.Lock()
	c.current(i) // makes the maps
	c.endpoints[i], c.rolled[i] = slices.Clone(addrs), 1
	c.mu.Unlock()
	return c.setEndpoints(i, addrs)
}

func (c *cluster) clusterIP(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clusterIPs[i]
}

// directWorld is a world without a proxy or API server, for the data path
// straight to a pod (NoProxy).
func (c *cluster) directWorld(t *testing.T) *netns.World {
	t.Helper()
	return netns.NewWorld(t, netns.Options{Pods: 1, TCPPorts: []int{podPort}, UDPPorts: []int{5353}})
}

// newWorld builds a fresh world with real pods for one proxy, connects its
// node to the API server and creates its Node object; it returns the node
// name the proxy must use.
func (c *cluster) newWorld(t *testing.T) (*netns.World, string) {
	t.Helper()
	w := netns.NewWorld(t, netns.Options{Pods: endpointsPer, TCPPorts: []int{podPort}, UDPPorts: []int{5353}})
	c.srv.Connect(w.Node(), w.PodCIDR())
	if err := netns.IP("-n", w.Client(), "route", "add", serviceRange.String(), "via", w.NodeIP().String()); err != nil {
		t.Fatalf("route the Service range %s from the client: %v", serviceRange, err)
	}
	name := fmt.Sprintf("bench-%d", w.Index())
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelHostname: name}},
		Spec:       v1.NodeSpec{PodCIDR: w.PodCIDR().String(), PodCIDRs: []string{w.PodCIDR().String()}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: w.NodeIP().String()},
			{Type: v1.NodeHostName, Address: name},
		}},
	}
	if _, err := c.api.CoreV1().Nodes().Create(ctx(t), node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Node %s: %v", name, err)
	}
	return w, name
}
