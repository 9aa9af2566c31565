package userspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	vnetns "github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// kernelWorld is a netns world (node, client, pods running echo servers)
// with the backend running in this process against the node namespace.
type kernelWorld struct {
	t       *testing.T
	w       *netns.World
	b       *Backend
	red     redirectMethod
	st      *proxy.State
	gen     uint64
	syncCtx context.Context
}

// redirectMethod is one way the kernel tests have the redirects written.
type redirectMethod struct {
	name, redirect, iptablesBackend string
}

// redirectMethods: the nftables table, and the iptables fallback in both
// iptables backends.
var redirectMethods = []redirectMethod{
	{"nftables", RedirectNFTables, ""},
	{"iptables-legacy", RedirectIPTables, "legacy"},
	{"iptables-nft", RedirectIPTables, "nft"},
}

// forEachRedirect runs body once per redirect method, as subtests.
func forEachRedirect(t *testing.T, body func(t *testing.T, red redirectMethod)) {
	for _, red := range redirectMethods {
		t.Run(red.name, func(t *testing.T) {
			if red.iptablesBackend != "" {
				netns.Require(t, "iptables-"+red.iptablesBackend+"-restore", "ip6tables-"+red.iptablesBackend+"-save")
			}
			body(t, red)
		})
	}
}

func newKernelWorld(t *testing.T, pods int) *kernelWorld {
	return newKernelWorldWith(t, pods, redirectMethods[0], proxy.Config{})
}

// newKernelWorldWith is newKernelWorld with the redirects written by red
// and cfg's userspace settings.
func newKernelWorldWith(t *testing.T, pods int, red redirectMethod, cfg proxy.Config) *kernelWorld {
	t.Helper()
	w := netns.NewWorld(t, netns.Options{Pods: pods})
	h, err := vnetns.GetFromName(w.Node())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Mode = proxy.ModeUserspace
	cfg.UserspaceRedirect, cfg.IPTablesBackend = red.redirect, red.iptablesBackend
	if cfg.UserspaceUDPIdleTimeout == 0 {
		cfg.UserspaceUDPIdleTimeout = 2 * time.Second
	}
	b, err := New(cfg, nil, NamespaceOps(h))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		b.Shutdown(sctx)
		h.Close()
	})
	kw := &kernelWorld{t: t, w: w, b: b, red: red, st: &proxy.State{
		Services:  map[proxy.ServicePortName]*proxy.ServicePort{},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
		Node:      proxy.Node{Name: "node-1", IPs: []netip.Addr{w.NodeIP()}},
	}}
	kw.syncCtx = ctx
	return kw
}

// add sets a service port (replacing one of the same name) with endpoints
// "ip:port" (ready, on node-1).
func (k *kernelWorld) add(name string, proto v1.Protocol, vip string, port, nodePort int32, eps ...string) proxy.ServicePortName {
	n := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: name}, Protocol: proto}
	k.st.Services[n] = &proxy.ServicePort{Name: n, Type: v1.ServiceTypeClusterIP, ClusterIPs: []netip.Addr{netip.MustParseAddr(vip)},
		Port: port, Protocol: proto, NodePort: nodePort}
	k.setEndpoints(n, eps...)
	return n
}

func (k *kernelWorld) setEndpoints(n proxy.ServicePortName, eps ...string) {
	var list []proxy.Endpoint
	for _, e := range eps {
		ap := netip.MustParseAddrPort(e)
		list = append(list, proxy.Endpoint{IP: ap.Addr(), Port: int32(ap.Port()), Ready: true, Serving: true}.At("node-1", ""))
	}
	k.st.Endpoints[n] = list
	k.markChanged(n)
}

// markChanged names n in the next sync's Changed, as the core does.
func (k *kernelWorld) markChanged(n proxy.ServicePortName) {
	if k.st.Changed == nil {
		k.st.Changed = map[proxy.ServicePortName]struct{}{}
	}
	k.st.Changed[n] = struct{}{}
}

func (k *kernelWorld) sync() {
	k.t.Helper()
	k.gen++
	st := *k.st
	st.Generation = k.gen
	k.st.Changed = nil
	if err := k.b.Sync(k.syncCtx, &st); err != nil {
		k.t.Fatalf("sync: %v", err)
	}
}

// rules lists the redirects of family ("ip" or "ip6"): the nftables table,
// or the iptables-save lines naming a KP-USERSPACE- chain.
func (k *kernelWorld) rules(family string) (string, error) {
	if k.red.iptablesBackend == "" {
		return k.w.NFT("list", "table", family, TableName)
	}
	bin := "iptables-" + k.red.iptablesBackend + "-save"
	if family == "ip6" {
		bin = "ip6" + bin[2:]
	}
	out, err := k.w.Exec(k.w.Node(), bin)
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "*") || strings.Contains(l, "KP-USERSPACE-") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n"), err
}

// ask dials addr from namespace ns and returns the echo server's name.
func (k *kernelWorld) ask(ns, network, addr string) (string, error) {
	reply, err := netns.Dial(ns, network, addr, 2*time.Second)
	name, _ := netns.ParseReply(reply)
	return name, err
}

func TestKernelServicesAnswerThroughTheProxyRoundRobinFromEveryWhere(t *testing.T) {
	forEachRedirect(t, testServicesAnswerRoundRobin)
}

func testServicesAnswerRoundRobin(t *testing.T, red redirectMethod) {
	k := newKernelWorldWith(t, 2, red, proxy.Config{})
	p0, p1 := k.w.Pods()[0], k.w.Pods()[1]
	k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 30080, p0.IP.String()+":8080", p1.IP.String()+":8080")
	k.add("dns", v1.ProtocolUDP, "10.96.0.12", 53, 30053, p0.IP.String()+":5353", p1.IP.String()+":5353")
	k.sync()
	node := k.w.NodeIP().String()
	for _, tc := range []struct {
		name, ns, network, addr string
	}{
		{"tcp clusterIP from the client", k.w.Client(), "tcp", "10.96.0.10:80"},
		{"tcp nodePort from the client", k.w.Client(), "tcp", node + ":30080"},
		{"tcp clusterIP from the node", k.w.Node(), "tcp", "10.96.0.10:80"},
		{"tcp clusterIP from a pod", p0.NS, "tcp", "10.96.0.10:80"},
		{"udp clusterIP from the client", k.w.Client(), "udp", "10.96.0.12:53"},
		{"udp nodePort from the client", k.w.Client(), "udp", node + ":30053"},
		{"udp clusterIP from the node", k.w.Node(), "udp", "10.96.0.12:53"},
		{"udp clusterIP from a pod", p1.NS, "udp", "10.96.0.12:53"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]int{}
			for range 4 {
				name, err := k.ask(tc.ns, tc.network, tc.addr)
				if err != nil {
					t.Fatalf("ask %s %s: %v", tc.network, tc.addr, err)
				}
				seen[name]++
			}
			// Each ask is a new connection (TCP) or a new client port
			// (UDP): round robin alternates.
			if seen["pod-0"] != 2 || seen["pod-1"] != 2 {
				t.Errorf("round robin over two endpoints, 4 asks: %v", seen)
			}
		})
	}
	counters, _ := k.b.EndpointCounters(k.st)
	var conns uint64
	for _, c := range counters {
		conns += c.Packets
	}
	if conns != 32 {
		t.Errorf("the proxy counted %d new connections and sessions, want 32: %v", conns, counters)
	}
	rules, err := k.rules("ip")
	if err != nil || !strings.Contains(rules, `comment "demo/web"`) || !strings.Contains(rules, "redirect to :") && !strings.Contains(rules, "REDIRECT --to-ports") {
		t.Errorf("the %s redirects: %v\n%s", red.name, err, rules)
	}
	if red.iptablesBackend == "" {
		// The map's elements, as nft lists them (test/bench counts them so).
		out, err := k.w.NFT("list", "map", "ip", TableName, mapRedirects)
		if err != nil || !regexp.MustCompile(`10\.96\.0\.10 \. tcp \. 80 comment "demo/web" : \d+`).MatchString(out) {
			t.Errorf("nft list map ip %s %s: %v\n%s", TableName, mapRedirects, err, out)
		}
	}
	if got := k.b.Redirector(); !strings.HasPrefix(got, red.redirect) || !strings.HasSuffix(got, red.iptablesBackend) {
		t.Errorf("Redirector() = %q, want %s", got, red.name)
	}
}

func TestKernelNoEndpointsRefusesAtOnceAndCleanupRemovesTheRules(t *testing.T) {
	forEachRedirect(t, testNoEndpointsRefusesAtOnce)
}

func testNoEndpointsRefusesAtOnce(t *testing.T, red redirectMethod) {
	k := newKernelWorldWith(t, 1, red, proxy.Config{})
	k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 30080)
	k.add("dns", v1.ProtocolUDP, "10.96.0.12", 53, 0)
	k.sync()
	for _, tc := range []struct{ ns, network, addr string }{
		{k.w.Client(), "tcp", "10.96.0.10:80"},
		{k.w.Client(), "tcp", k.w.NodeIP().String() + ":30080"},
		{k.w.Client(), "udp", "10.96.0.12:53"},
		{k.w.Node(), "tcp", "10.96.0.10:80"},
	} {
		start := time.Now()
		_, err := k.ask(tc.ns, tc.network, tc.addr)
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
			t.Errorf("%s %s from %s: want refused at once, got %v after %v", tc.network, tc.addr, tc.ns, err, time.Since(start))
		}
	}
	if err := k.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out, err := k.w.NFT("list", "tables"); err != nil || strings.Contains(out, TableName) {
		t.Errorf("after Cleanup: %v\n%s", err, out)
	}
	for _, fl := range []string{"legacy", "nft"} {
		for _, bin := range []string{"iptables-" + fl + "-save", "ip6tables-" + fl + "-save"} {
			if out, err := k.w.Exec(k.w.Node(), bin); err != nil || strings.Contains(out, "KP-") {
				t.Errorf("after Cleanup, %s: %v\n%s", bin, err, out)
			}
		}
	}
	if err := k.b.Cleanup(context.Background()); err != nil {
		t.Errorf("a second Cleanup: %v", err)
	}
}

func TestKernelFailedDialIsRetriedOnTheNextEndpoint(t *testing.T) {
	k := newKernelWorld(t, 1)
	p0 := k.w.Pods()[0]
	// 9999: nothing listens; the pod answers with a reset.
	k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 0, p0.IP.String()+":9999", p0.IP.String()+":8080")
	k.sync()
	for i := range 6 {
		if name, err := k.ask(k.w.Client(), "tcp", "10.96.0.10:80"); err != nil || name != "pod-0" {
			t.Fatalf("ask %d: %q %v", i, name, err)
		}
	}
}

// serveInPod runs, inside ns, a TCP server on port: per connection it
// reads lines and answers each with "echo: LINE", and at the client's EOF
// writes "bye N" (N lines read) and closes: a half-closed client still
// gets the last answer.
func serveInPod(t *testing.T, ns string, port int) {
	t.Helper()
	netns.Serve(t, ns, fmt.Sprintf(":%d", port), func(c net.Conn) {
		sc := bufio.NewScanner(c)
		n := 0
		for sc.Scan() {
			n++
			fmt.Fprintf(c, "echo: %s\n", sc.Text())
		}
		fmt.Fprintf(c, "bye %d\n", n)
	})
}

func TestKernelHalfCloseAndOpenConnectionsSurviveEndpointRemoval(t *testing.T) {
	k := newKernelWorld(t, 2)
	p0, p1 := k.w.Pods()[0], k.w.Pods()[1]
	serveInPod(t, p0.NS, 9000)
	web := k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 0, p0.IP.String()+":9000")
	k.sync()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := netns.DialConn(ctx, k.w.Client(), "tcp", "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	line := func() string {
		s, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return strings.TrimSpace(s)
	}
	fmt.Fprintf(c, "one\n")
	if got := line(); got != "echo: one" {
		t.Fatalf("got %q", got)
	}
	if n := k.b.ActiveConnections()[ref(web, netip.AddrPortFrom(p0.IP, 9000))]; n != 1 {
		t.Errorf("active connections to the endpoint: %d, want 1", n)
	}

	// The endpoint leaves: new connections go to pod-1, the open one runs on.
	// Endpoints live in the balancers: the table is not rewritten (its
	// rule handles stay).
	before, _ := k.w.NFT("-a", "list", "table", "ip", TableName)
	k.setEndpoints(web, p1.IP.String()+":8080")
	k.sync()
	if after, err := k.w.NFT("-a", "list", "table", "ip", TableName); err != nil || after != before {
		t.Errorf("an endpoint change rewrote the table (%v):\n%s\nthen\n%s", err, before, after)
	}
	if name, err := k.ask(k.w.Client(), "tcp", "10.96.0.10:80"); err != nil || name != "pod-1" {
		t.Errorf("a new connection after the change: %q %v, want pod-1", name, err)
	}
	fmt.Fprintf(c, "two\n")
	if got := line(); got != "echo: two" {
		t.Fatalf("the open connection after the endpoint left: got %q", got)
	}
	// Half-close: the client stops writing and still reads the answer.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got := line(); got != "bye 2" {
		t.Errorf("after the client's half-close: got %q, want \"bye 2\"", got)
	}
	if _, err := r.ReadString('\n'); err != io.EOF {
		t.Errorf("after the server closed: %v, want EOF", err)
	}
}

func TestKernelShutdownRefusesNewConnectionsAndDrainsOpenOnesWithinItsBound(t *testing.T) {
	k := newKernelWorld(t, 1)
	p0 := k.w.Pods()[0]
	serveInPod(t, p0.NS, 9000)
	k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 0, p0.IP.String()+":9000")
	k.sync()
	dial := func() (net.Conn, *bufio.Reader) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := netns.DialConn(ctx, k.w.Client(), "tcp", "10.96.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "hello\n")
		r := bufio.NewReader(c)
		if s, err := r.ReadString('\n'); err != nil || s != "echo: hello\n" {
			t.Fatalf("before shutdown: %q %v", s, err)
		}
		return c, r
	}
	finishing, fr := dial() // closes within the bound
	lingering, lr := dial() // outlives it

	bound := 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- k.b.Shutdown(ctx) }()
	time.Sleep(200 * time.Millisecond)

	if _, err := k.ask(k.w.Client(), "tcp", "10.96.0.10:80"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a new connection during shutdown: %v, want refused", err)
	}
	fmt.Fprintf(finishing, "still\n")
	if s, err := fr.ReadString('\n'); err != nil || s != "echo: still\n" {
		t.Errorf("an open connection during shutdown: %q %v", s, err)
	}
	finishing.(*net.TCPConn).CloseWrite()
	if s, _ := fr.ReadString('\n'); s != "bye 2\n" {
		t.Errorf("the draining connection's end: %q", s)
	}
	err := <-done
	if took := time.Since(start); err == nil || took < bound || took > bound+time.Second {
		t.Errorf("Shutdown with a connection outliving its %v bound: %v after %v, want an error at the bound", bound, err, took)
	}
	if _, err := lr.ReadString('\n'); err == nil {
		t.Errorf("the connection that outlived the bound is still open")
	}
	lingering.Close()
	finishing.Close()
}

// A kernel whose nftables cannot redirect (here: netlink refuses, as
// without nf_tables) gets the iptables redirects under auto, and traffic
// flows through them; Cleanup still succeeds.
func TestKernelAutoFallsBackToIPTablesWhenNFTablesCannotRedirect(t *testing.T) {
	netns.Require(t, "iptables-nft-restore", "iptables-legacy-restore")
	w := netns.NewWorld(t, netns.Options{Pods: 1})
	h, err := vnetns.GetFromName(w.Node())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	b, err := New(proxy.Config{Mode: proxy.ModeUserspace, UserspaceRedirect: RedirectAuto}, nil, NamespaceOps(h))
	if err != nil {
		t.Fatal(err)
	}
	b.ops.nft = func(...nftables.ConnOption) (*nftables.Conn, error) {
		return nil, fmt.Errorf("netlink: %w", syscall.EPROTONOSUPPORT)
	}
	if err := b.Probe(context.Background()); err != nil {
		t.Fatalf("Probe with nftables refused: %v", err)
	}
	if got := b.Redirector(); !strings.HasPrefix(got, RedirectIPTables) {
		t.Fatalf("Redirector() = %q, want the iptables fallback", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		b.Shutdown(sctx)
	}()
	k := &kernelWorld{t: t, w: w, b: b, syncCtx: ctx, st: &proxy.State{
		Services:  map[proxy.ServicePortName]*proxy.ServicePort{},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
		Node:      proxy.Node{Name: "node-1", IPs: []netip.Addr{w.NodeIP()}},
	}}
	k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 30080, w.Pods()[0].IP.String()+":8080")
	k.sync()
	for _, addr := range []string{"10.96.0.10:80", w.NodeIP().String() + ":30080"} {
		if name, err := k.ask(w.Client(), "tcp", addr); err != nil || name != "pod-0" {
			t.Errorf("%s through the iptables fallback: %q %v", addr, name, err)
		}
	}
	if err := b.Cleanup(context.Background()); err != nil {
		t.Errorf("Cleanup without nftables: %v", err)
	}
}

// Thousands of service ports are one nftables transaction, larger than a
// netlink socket's default send buffer (212 kB: EMSGSIZE without
// batchBuffers), their elements (with long Service names in comments) more
// than one netlink attribute holds (64 KiB: elemChunks), and still answer.
func TestKernelThousandsOfServicesSyncInOneTransaction(t *testing.T) {
	k := newKernelWorld(t, 1)
	p0 := k.w.Pods()[0].IP.String() + ":8080"
	const n = 3000
	for i := range n {
		k.add(fmt.Sprintf("a-service-with-a-rather-long-name-of-fifty-chars-%04d", i), v1.ProtocolTCP, fmt.Sprintf("10.96.%d.%d", 1+i/250, 1+i%250), 80, 0, p0)
	}
	k.sync()
	for _, addr := range []string{"10.96.1.1:80", fmt.Sprintf("10.96.%d.%d:80", 1+(n-1)/250, 1+(n-1)%250)} {
		if name, err := k.ask(k.w.Client(), "tcp", addr); err != nil || name != "pod-0" {
			t.Errorf("%s among %d Services: %q %v", addr, n, name, err)
		}
	}
}
