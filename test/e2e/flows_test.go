package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// kpFlows runs kp flows against the node namespace, from the test's own
// namespace, and returns its standard output.
func (e *env) kpFlows(args ...string) string {
	e.t.Helper()
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(kp, append([]string{"flows", "--netns", e.w.Node(), "--status-socket", e.socket}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		e.t.Fatalf("kp flows %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func (e *env) kpFlowsJSON(args ...string) []conntrack.FlowReport {
	e.t.Helper()
	out := e.kpFlows(append(args, "-o", "json")...)
	var reports []conntrack.FlowReport
	if err := json.Unmarshal([]byte(out), &reports); err != nil {
		e.t.Fatalf("kp flows -o json: %v\n%s", err, out)
	}
	return reports
}

// made is one connection the test made and what kp flows must say of it.
type made struct {
	what        string
	client      netip.AddrPort
	service     string // namespace/name:port
	via         conntrack.Via
	endpoint    netip.AddrPort
	kernelState string
}

func TestKpFlowsShowsTheConnectionsTheTestMade(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		skipUnclaimed(t, m, featureConntrackNAT)
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		svc := web(pods[0], pods[1])
		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[1].NodePort = 30053
		other := Service{Namespace: "other-ns", Name: "other", ClusterIPs: []string{"10.96.0.30"},
			Ports: []Port{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5354}}, Endpoints: endpoints(pods[2])}
		e.write("web.yaml", svc, other)
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP)

		podByName := map[string]*netns.Pod{}
		for _, p := range pods {
			podByName[p.Name] = p
		}
		var conns []made
		udp := func(what, addr, service string, via conntrack.Via, port int) {
			c := e.startUDPClient(e.w.Client(), addr)
			ev := e.waitFor(c, what+" answers", time.Time{}, 15*time.Second, func(ev udpEvent) bool { return ev.From != "" })
			conns = append(conns, made{what: what, client: c.source(), service: service, via: via,
				endpoint: netip.AddrPortFrom(podByName[ev.From].IP, uint16(port))})
		}
		udp("udp to the ClusterIP", webUDP, "e2e/web:dns", conntrack.ViaClusterIP, 5353)
		udp("udp to the NodePort", hostPort(e.w.NodeIP().String(), 30053), "e2e/web:dns", conntrack.ViaNodePort, 5353)
		udp("udp to another Service", "10.96.0.30:53", "other-ns/other:dns", conntrack.ViaClusterIP, 5354)

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tcp, err := netns.DialConn(ctx, e.w.Client(), "tcp", webTCP)
		if err != nil {
			t.Fatal(err)
		}
		name := readName(t, tcp)
		tcpSrc := netip.MustParseAddrPort(tcp.LocalAddr().String())
		conns = append(conns, made{what: "tcp to the ClusterIP", client: tcpSrc,
			service: "e2e/web:http", via: conntrack.ViaClusterIP, endpoint: netip.AddrPortFrom(podByName[name].IP, 8080)})
		// The echo server closes after its line; once the client closes too the
		// entry rests in TIME_WAIT, a state that holds still while we compare.
		tcp.Close()
		e.eventually("the TCP entry reaches TIME_WAIT", 15*time.Second, func() error {
			for _, f := range e.conntrackFrom(tcpSrc) {
				if f.State() == "TIME_WAIT" {
					return nil
				}
			}
			return fmt.Errorf("entries: %v", e.conntrackFrom(tcpSrc))
		})
		for i := range conns {
			flows := e.conntrackFrom(conns[i].client)
			if len(flows) != 1 {
				t.Fatalf("%s: %d conntrack entries from %s", conns[i].what, len(flows), conns[i].client)
			}
			conns[i].kernelState = flows[0].State()
		}

		reports := e.kpFlowsJSON()
		// A UDP entry turns ASSURED once it has lived 2 s with traffic both
		// ways: accept the state the kernel had before or after kp flows ran.
		for i := range conns {
			if after := e.conntrackFrom(conns[i].client); len(after) == 1 && after[0].State() != conns[i].kernelState {
				for j := range reports {
					if reports[j].Client == conns[i].client.String() && reports[j].State == after[0].State() {
						reports[j].State = conns[i].kernelState
					}
				}
			}
		}
		for _, c := range conns {
			r, ok := reportFrom(reports, c.client)
			if !ok {
				t.Errorf("%s: kp flows has no flow from %s", c.what, c.client)
				continue
			}
			got := fmt.Sprintf("%s/%s:%s", r.Namespace, r.Service, r.PortName)
			if got != c.service || r.Via != c.via || r.Endpoint != c.endpoint.String() || r.EndpointState != "ready" || r.State != c.kernelState {
				t.Errorf("%s: kp flows says %s via %s → %s (%s) state %s; want %s via %s → %s (ready) state %s",
					c.what, got, r.Via, r.Endpoint, r.EndpointState, r.State, c.service, c.via, c.endpoint, c.kernelState)
			}
			// kp turned accounting and timestamps on before these flows began.
			if r.Packets == nil || *r.Packets < 2 || r.AgeSeconds == nil {
				t.Errorf("%s: packets %v age %v, want counted and timed", c.what, r.Packets, r.AgeSeconds)
			}
		}
		if !strings.Contains(e.kp.Log(), "turned on conntrack per-flow packet and byte counters") {
			t.Errorf("kp's log does not say it turned on conntrack accounting")
		}

		// Filters: by namespace, and by Service name.
		for _, r := range e.kpFlowsJSON("-n", "other-ns") {
			if r.Namespace != "other-ns" {
				t.Errorf("-n other-ns lists %s/%s", r.Namespace, r.Service)
			}
		}
		if got := e.kpFlowsJSON("-n", "other-ns"); len(got) != 1 {
			t.Errorf("-n other-ns: %d flows, want 1", len(got))
		}
		webFlows := e.kpFlowsJSON("-n", "e2e", "--service", "web")
		for _, r := range webFlows {
			if r.Namespace != "e2e" || r.Service != "web" {
				t.Errorf("-n e2e --service web lists %s/%s", r.Namespace, r.Service)
			}
		}
		for _, c := range conns {
			if _, ok := reportFrom(webFlows, c.client); ok != strings.HasPrefix(c.service, "e2e/web:") {
				t.Errorf("-n e2e --service web: %s listed = %v", c.what, ok)
			}
		}

		// The table says the same, one line per flow.
		table := e.kpFlows()
		for _, c := range conns {
			line := lineWith(table, c.client.String())
			for _, want := range []string{c.service, string(c.via), c.endpoint.String(), "ready"} {
				if !strings.Contains(line, want) {
					t.Errorf("%s: table line %q lacks %q", c.what, line, want)
				}
			}
			if !strings.Contains(line, " "+c.kernelState+" ") && !(strings.HasPrefix(c.what, "udp") && strings.Contains(line, " ASSURED ")) {
				t.Errorf("%s: table line %q lacks the state %s", c.what, line, c.kernelState)
			}
		}
		if t.Failed() {
			t.Logf("kp flows:\n%s", table)
		}
	})
}

func readName(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	name, _ := netns.ParseReply(strings.TrimSpace(string(buf[:n])))
	return name
}

func reportFrom(reports []conntrack.FlowReport, client netip.AddrPort) (conntrack.FlowReport, bool) {
	for _, r := range reports {
		if r.Client == client.String() {
			return r, true
		}
	}
	return conntrack.FlowReport{}, false
}

func lineWith(text, s string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

func TestStatusAPIReportsSyncsEndpointsAndNewConnections(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		e.write("web.yaml", web(pods[0], pods[1]), Service{Name: "empty", ClusterIPs: []string{"10.96.0.20"},
			Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}})
		e.startKP()
		e.answers(pods[2].NS, "tcp", webTCP)
		const n = 20
		counts := e.spread(t, pods[2].NS, "tcp", webTCP, n)

		c := e.statusClient()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.APIVersion != "kp/v1" || st.Mode != m.proxyMode || st.Node != nodeName || st.LastSync == nil ||
			st.Syncs.Succeeded < 1 || !st.Healthy || st.ServicePorts != 3 {
			t.Errorf("/kp/v1/status: %+v", st)
		}

		// Counters may lag the connections a little (IPVS sums its
		// per-CPU statistics every 2 s): wait until they hold them all.
		var svcs *statusapi.Services
		e.eventually("the counters hold the test's connections", 10*time.Second, func() error {
			var err error
			if svcs, err = c.Services(ctx, "e2e", "web"); err != nil {
				return err
			}
			var total uint64
			for _, sp := range svcs.ServicePorts {
				for _, ep := range sp.Endpoints {
					if sp.PortName == "http" && ep.Counters != nil {
						total += ep.Counters.NewConnections
					}
				}
			}
			if total < n {
				return fmt.Errorf("%d new connections counted, want at least %d", total, n)
			}
			return nil
		})
		if len(svcs.ServicePorts) != 2 {
			t.Fatalf("/kp/v1/services?namespace=e2e&service=web: %d ports, want 2 (http, dns)", len(svcs.ServicePorts))
		}
		var http = svcs.ServicePorts[1]
		if http.PortName != "http" || http.ClusterIPs[0] != "10.96.0.10" || http.Port != 80 || http.Protocol != "TCP" {
			t.Fatalf("web:http: %+v", http)
		}
		var total uint64
		for _, ep := range http.Endpoints {
			if ep.Counters == nil {
				t.Errorf("endpoint %s has no counters", ep.IP)
				continue
			}
			total += ep.Counters.NewConnections
			if pod := podAt(pods, ep.IP); pod != nil && ep.Counters.NewConnections < uint64(counts[pod.Name]) {
				t.Errorf("endpoint %s (%s): %d new connections counted, the test made %d", ep.IP, pod.Name, ep.Counters.NewConnections, counts[pod.Name])
			}
			if !ep.Ready || !ep.Usable {
				t.Errorf("endpoint %+v not ready and usable", ep)
			}
		}
		// The readiness probes above (answers) add a few connections.
		if total < n {
			t.Errorf("%d new connections counted over web:http's endpoints, the test made at least %d", total, n)
		}
		if svcs.CountersError != "" {
			t.Errorf("counters error: %s", svcs.CountersError)
		}
	})
}

func podAt(pods []*netns.Pod, ip string) *netns.Pod {
	for _, p := range pods {
		if p.IP.String() == ip {
			return p
		}
	}
	return nil
}

// Flow accounting (per-flow counters and start times, which kp flows and
// kp top show) is on before kp's first sync: a conntrack entry gets them
// only when it is created with accounting on, and the first connections
// come the moment kp is ready. In a fresh network namespace it is off; kp
// turned it on only after its first sync, so a flow made at once lacked
// counters (kp flows showed "-", once in make test).
func TestFlowAccountingIsOnBeforeTheFirstSync(t *testing.T) {
	m := modeNFTables
	skipUnselected(t, m)
	e := newEnv(t, m, 1) // parallel
	e.write("web.yaml", web(e.w.Pods()...))
	e.startKP()
	log := e.kp.Log()
	on := strings.Index(log, "turned on conntrack per-flow packet and byte counters")
	synced := strings.Index(log, "sources synced; starting sync loop")
	if on < 0 || synced < 0 || on > synced {
		t.Errorf("flow accounting turned on at byte %d of kp's log, its sync loop started at byte %d: want it on before\n%s", on, synced, log)
	}
}
