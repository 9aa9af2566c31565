package bench

import (
	"flag"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/test/netns"
)

// The paths a user hits (userpath.go), measured in the data path's rounds.
// Services udp and nodeport exist before the N's first cold start, so
// every proxy programs them with the others; neither is on servicePort or
// leads to podPort, so the proxies' Service counts leave them out.
const (
	udpService      = "udp"
	udpPort         = 53
	udpPodPort      = 5353 // the pods' echo servers answer UDP there (newWorld)
	nodePortService = "nodeport"
	nodePortPort    = 82
	greeterPort     = 9001 // a greeter in each world's first pod, Service nodeport's endpoint
)

var flagPathNs = flag.String("bench.paths.n", "10000",
	"comma-separated Ns whose data-path rounds take the paths a user hits too (100 Services, UDP, NodePort; \"\": none)")

// pathFlags reads -bench.paths.n.
func pathFlags(t *testing.T) []int { return serviceCounts(t, "bench.paths.n", *flagPathNs) }

// pathsAt is the number of paths a user hits taken at n: all of them
// where -bench.paths.n names n, else none.
func (c config) pathsAt(n int) int {
	if slices.Contains(c.PathNs, n) {
		return len(userPaths)
	}
	return 0
}

// pathSetup is an N's Services of the paths: the chosen ones, udp and
// nodeport.
type pathSetup struct {
	t        *testing.T
	c        *cluster
	n        int
	seed     uint64
	chosen   []int
	udpIP    string // Service udp's ClusterIP
	nodePort int    // Service nodeport's NodePort
	greeters map[*netns.World]bool
}

// newPathSetup draws the N's Services with the run's seed and creates
// Services udp and nodeport (once per run).
func newPathSetup(t *testing.T, c *cluster, n int, runID string) *pathSetup {
	t.Helper()
	s := &pathSetup{t: t, c: c, n: n, seed: pathSeed(runID), greeters: map[*netns.World]bool{}}
	s.chosen = chooseServices(s.seed, n, pathServiceCount)
	udp := c.ensureService(udpService, v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "udp", Protocol: v1.ProtocolUDP, Port: udpPort}}})
	np := c.ensureService(nodePortService, v1.ServiceSpec{Type: v1.ServiceTypeNodePort,
		Ports: []v1.ServicePort{{Name: "np", Protocol: v1.ProtocolTCP, Port: nodePortPort}}})
	s.udpIP, s.nodePort = udp.Spec.ClusterIP, int(np.Spec.Ports[0].NodePort)
	t.Logf("N=%d: %d Services for the paths, drawn with seed %d; Service udp at %s, nodeport's NodePort %d",
		n, len(s.chosen), s.seed, s.udpIP, s.nodePort)
	return s
}

// ensureService creates Service name with spec unless it exists, and
// returns it.
func (c *cluster) ensureService(name string, spec v1.ServiceSpec) *v1.Service {
	c.t.Helper()
	svcs := c.api.CoreV1().Services(namespace)
	svc, err := svcs.Get(ctx(c.t), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		svc, err = svcs.Create(ctx(c.t), &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: spec},
			metav1.CreateOptions{})
	}
	if err != nil {
		c.t.Fatalf("Service %s/%s: %v", namespace, name, err)
	}
	return svc
}

// pointSlice makes Service name's one EndpointSlice (port portName, proto)
// hold addr:port, ready.
func (c *cluster) pointSlice(name, portName string, proto v1.Protocol, addr string, port int) {
	c.t.Helper()
	ready := true
	sl := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr(portName), Protocol: ptr(proto), Port: ptr(int32(port))}},
		Endpoints:   []discovery.Endpoint{{Addresses: []string{addr}, Conditions: discovery.EndpointConditions{Ready: &ready}}},
	}
	api := c.api.DiscoveryV1().EndpointSlices(namespace)
	var err error
	if cur, gerr := api.Get(ctx(c.t), name, metav1.GetOptions{}); gerr == nil {
		sl.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx(c.t), sl, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(ctx(c.t), sl, metav1.CreateOptions{})
	}
	if err != nil {
		c.t.Fatalf("EndpointSlice %s/%s: %v", namespace, name, err)
	}
}

// ready points the paths' Services at world w's pods (the chosen ones at
// all of them, udp and nodeport at the first) once proxy's changes and
// churn are done with them, and waits until each answers from the client
// through the proxy's rules: a chosen Service that does not fails the test.
func (s *pathSetup) ready(w *netns.World, proxy string, timeout time.Duration) {
	if s == nil {
		return
	}
	s.t.Helper()
	pod := w.Pods()[0]
	if !s.greeters[w] {
		netns.Serve(s.t, pod.NS, fmt.Sprintf(":%d", greeterPort), func(c net.Conn) { fmt.Fprintf(c, "%s nodeport\n", pod.Name) })
		s.greeters[w] = true
	}
	var addrs []string
	for _, p := range w.Pods() {
		addrs = append(addrs, p.IP.String())
	}
	for _, i := range s.chosen {
		if _, err := s.c.setEndpoints(i, addrs); err != nil {
			s.t.Fatalf("point Service %s at the pods: %v", serviceName(i), err)
		}
	}
	s.c.pointSlice(udpService, "udp", v1.ProtocolUDP, pod.IP.String(), udpPodPort)
	s.c.pointSlice(nodePortService, "np", v1.ProtocolTCP, pod.IP.String(), greeterPort)
	start := time.Now()
	deadline := start.Add(timeout)
	tg := s.target(proxy, w)
	defer func() {
		s.t.Logf("%s N=%d: the paths' Services pointed at its pods and answering in %v", proxy, s.n, time.Since(start).Round(time.Millisecond))
	}()
	answers := func(network, addr string) error {
		for {
			// Short: until the proxy synced the new endpoints, a packet
			// is DNATed to a fake address and answers nothing.
			reply, err := netns.Dial(w.Client(), network, addr, 300*time.Millisecond)
			if err == nil && strings.HasPrefix(reply, "pod-") {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%q %v", reply, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for k, addr := range tg.services {
		if err := answers("tcp", addr); err != nil {
			s.t.Errorf("%s N=%d: Service %s at %s, one of the paths' Services, does not answer: %v", proxy, s.n, serviceName(s.chosen[k]), addr, err)
		}
	}
	if err := answers("udp", tg.udp); err != nil {
		s.t.Errorf("%s N=%d: Service %s at %s does not answer: %v", proxy, s.n, udpService, tg.udp, err)
	}
	if err := answers("tcp", tg.nodePort); err != nil {
		s.t.Errorf("%s N=%d: Service %s at NodePort %s does not answer from off the node: %v", proxy, s.n, nodePortService, tg.nodePort, err)
	}
}

// pathTarget is where each path's load goes for one proxy, or direct.
type pathTarget struct {
	proxy    string
	w        *netns.World
	services []string // the chosen Services' ClusterIP:port, in draw order
	udp      string
	nodePort string
}

// target is proxy's pathTarget in world w; for NoProxy, every path goes
// straight to w's first pod (its echo server).
func (s *pathSetup) target(proxy string, w *netns.World) pathTarget {
	if proxy == NoProxy {
		pod := w.Pods()[0].IP.String()
		tcp := net.JoinHostPort(pod, strconv.Itoa(podPort))
		return pathTarget{proxy: proxy, w: w, services: []string{tcp}, udp: net.JoinHostPort(pod, strconv.Itoa(udpPodPort)), nodePort: tcp}
	}
	tg := pathTarget{proxy: proxy, w: w, udp: net.JoinHostPort(s.udpIP, strconv.Itoa(udpPort)),
		nodePort: net.JoinHostPort(w.NodeIP().String(), strconv.Itoa(s.nodePort))}
	for _, i := range s.chosen {
		tg.services = append(tg.services, net.JoinHostPort(s.c.clusterIP(i), strconv.Itoa(servicePort)))
	}
	return tg
}

// measure takes one window of each path through tg (a data-path target),
// the node's conntrack table emptied before each.
func (s *pathSetup) measure(tg dataPathTarget, cfg config) []UserPath {
	if s == nil {
		return nil
	}
	pt := s.target(tg.proxy, tg.w)
	var out []UserPath
	for _, path := range userPaths {
		flushConntrack(tg.w.Node())
		var u UserPath
		switch path {
		case pathServices:
			u = tcpWindow(tg.w.Client(), pt.services, cfg.Workers, cfg.Window)
			if tg.proxy != NoProxy {
				u.Services, u.Seed = len(pt.services), s.seed
			}
		case pathUDP:
			u = udpWindow(tg.w.Client(), pt.udp, cfg.Workers, cfg.Window)
		case pathNodePort:
			u = tcpWindow(tg.w.Client(), []string{pt.nodePort}, cfg.Workers, cfg.Window)
		}
		u.Path, u.Proxy, u.N = path, tg.proxy, s.n
		out = append(out, u)
	}
	return out
}

// widest is the largest half-width of the paths' paired ratios (each
// comparison both of whose proxies are measured): their rates and the
// Services' p50 latency.
func (s *pathSetup) widest(r *Results, measured []string) float64 {
	if s == nil {
		return math.NaN()
	}
	var ivs []Interval
	for _, cm := range comparisons {
		if !slices.Contains(measured, cm.kp) || !slices.Contains(measured, cm.upstream) {
			continue
		}
		for _, path := range userPaths {
			ivs = append(ivs, ratio(r.userPathsOf(path, cm.kp, s.n, perSec), r.userPathsOf(path, cm.upstream, s.n, perSec)))
		}
		ivs = append(ivs, ratio(r.userPathsOf(pathServices, cm.kp, s.n, p50Of), r.userPathsOf(pathServices, cm.upstream, s.n, p50Of)))
	}
	return widest(ivs)
}

// widerOf is the larger of two widest half-widths, NaN (nothing to
// compare) only when both are.
func widerOf(a, b float64) float64 {
	if !(a >= b) && b == b {
		return b
	}
	return a
}
