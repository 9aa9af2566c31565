package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kpproxy/kp/test/netns"
)

// localLB is a LoadBalancer Service with externalTrafficPolicy Local and a
// healthCheckNodePort, as the API server would have allocated it.
func localLB(name, clusterIP string, nodePort, hcPort int32, eps []Endpoint) []any {
	objs := Service{Name: name, Type: v1.ServiceTypeLoadBalancer, ClusterIPs: []string{clusterIP},
		Ports:                 []Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: nodePort}},
		ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal, Endpoints: eps}.Objects()
	objs[0].(*v1.Service).Spec.HealthCheckNodePort = hcPort
	return objs
}

// podsOn lists pods as ready IPv4 endpoints on the named node.
func podsOn(node string, pods ...*netns.Pod) []Endpoint {
	var eps []Endpoint
	for _, p := range pods {
		eps = append(eps, Endpoint{IP: p.IP.String(), NodeName: node})
	}
	return eps
}

func TestHealthCheckNodePortReportsLocalEndpoints(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 2)
		pods := e.w.Pods()
		const hcPort = 32100
		url := fmt.Sprintf("http://%s/", hostPort(e.w.NodeIP().String(), hcPort))
		e.write("lb.yaml", localLB("lb", "10.96.0.60", 30060, hcPort, podsOn(nodeName, pods...))...)
		e.startKP()

		expect := func(what string, code, local int, healthy bool) {
			t.Helper()
			want := fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": \"e2e\",\n\t\t\"name\": \"lb\"\n\t},\n"+
				"\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}", local, healthy)
			// Upstream's headers (service_health.go): the JSON type, no
			// sniffing, and the local endpoint count as a load balancer's
			// weight.
			wantHeader := map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff",
				"X-Load-Balancing-Endpoint-Weight": strconv.Itoa(local)}
			e.eventually(what, 15*time.Second, func() error {
				got, header, body, err := httpGetHeader(e.w.Client(), url, 2*time.Second)
				if err != nil {
					return err
				}
				if got != code || body != want {
					return fmt.Errorf("GET %s from the client: %d %q, want %d %q", url, got, body, code, want)
				}
				for k, v := range wantHeader {
					if header[k] == nil || len(header[k]) != 1 || header[k][0] != v {
						return fmt.Errorf("GET %s from the client: header %s: %q, want %q (headers %v)", url, k, header[k], v, header)
					}
				}
				return nil
			})
		}
		expect("both pods on this node", 200, 2, true)

		// The endpoints move to another node: this node must fail the check
		// so the load balancer stops sending it traffic it would drop.
		e.write("lb.yaml", localLB("lb", "10.96.0.60", 30060, hcPort, podsOn(otherNode, pods...))...)
		expect("endpoints on another node", 503, 0, true)

		e.write("lb.yaml", localLB("lb", "10.96.0.60", 30060, hcPort, podsOn(nodeName, pods[0]))...)
		expect("one pod back on this node", 200, 1, true)

		e.write("lb.yaml", localLB("lb", "10.96.0.60", 30060, hcPort, nil)...)
		expect("no endpoints at all", 503, 0, true)

		// The Service goes away: so does its health check port.
		if err := e.dir.Remove("lb.yaml"); err != nil {
			t.Fatal(err)
		}
		e.eventually("health check port closed", 15*time.Second, func() error {
			if _, _, err := e.w.HTTPGet(e.w.Client(), url, 2*time.Second); !isRefused(err) {
				return fmt.Errorf("GET %s: %v, want connection refused", url, err)
			}
			return nil
		})
	})
}

// httpGetHeader fetches url from inside namespace ns, as netns.HTTPGet, and
// returns the response's headers too.
func httpGetHeader(ns, url string, timeout time.Duration) (int, http.Header, string, error) {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: true,
		Proxy:             nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.DialConn(ctx, ns, network, addr)
		},
	}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body), err
}

func TestMetricsEndpointHasUpstreamMetricsWithSensibleValues(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 2)
		pods := e.w.Pods()
		e.write("web.yaml", web(pods...))
		// A Local Service whose only endpoint is elsewhere: counted by
		// kubeproxy_sync_proxy_rules_no_local_endpoints_total.
		e.write("lb.yaml", localLB("lb", "10.96.0.61", 30061, 32101, podsOn(otherNode, pods[0]))...)
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP)

		// A change with a trigger time, after kp started: a partial sync and
		// a network programming latency sample.
		objs := web(pods[0]).Objects()
		for _, o := range objs[1:] {
			sl := o.(*discovery.EndpointSlice)
			sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
		}
		e.write("web.yaml", objs...)
		e.answers(e.w.Client(), "tcp", webTCP, pods[0].Name)
		for _, path := range []string{"/healthz", "/livez"} {
			if code, body, err := e.w.HTTPGet(e.w.Node(), "http://"+healthzAddr+path, 2*time.Second); err != nil || code != 200 ||
				!strings.Contains(body, `"healthy":true`) {
				t.Errorf("GET %s: %d %q %v", path, code, body, err)
			}
		}
		if code, body, err := e.w.HTTPGet(e.w.Node(), "http://"+metricsAddr+"/proxyMode", 2*time.Second); err != nil || code != 200 || body != m.proxyMode {
			t.Errorf("GET /proxyMode: %d %q %v", code, body, err)
		}

		now := float64(time.Now().Unix())
		checks := []struct {
			series string
			ok     func(v float64) bool
			want   string
		}{
			{`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`, atLeast(2), ">= 2"},
			{`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`, atLeast(1), ">= 1"},
			{`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv6"}`, atLeast(1), ">= 1"},
			{`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
				func(v float64) bool { return v > now-120 && v <= now+1 }, "within the last two minutes"},
			{`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`, atLeast(now - 120), "recent"},
			{`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`, atLeast(1), ">= 1"},
			{`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}`, equal(1), "1"},
			{`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"}`, equal(0), "0"},
			{m.syncFailures, equal(0), "0"},
			{`kp_sync_proxy_rules_failures_total`, equal(0), "0"},
			{`kubeproxy_sync_proxy_rules_service_changes_total`, atLeast(2), ">= 2"},
			{`kubeproxy_sync_proxy_rules_endpoint_changes_total`, atLeast(3), ">= 3"},
			{`kubeproxy_sync_proxy_rules_service_changes_pending`, equal(0), "0"},
			{`kubeproxy_sync_proxy_rules_endpoint_changes_pending`, equal(0), "0"},
			{`kubeproxy_proxy_healthz_total{code="200"}`, atLeast(1), ">= 1"},
			{`kubeproxy_proxy_livez_total{code="200"}`, atLeast(1), ">= 1"},
		}
		if m.userspace {
			// The proxy's own: the connections the test made, none open
			// once their answers came back, no dial error.
			checks = append(checks, []struct {
				series string
				ok     func(v float64) bool
				want   string
			}{
				{`kp_userspace_connections_total{protocol="TCP"}`, atLeast(2), ">= 2"},
				{`kp_userspace_active_connections{protocol="TCP"}`, equal(0), "0"},
				{`kp_userspace_bytes_total{direction="to_client",protocol="TCP"}`, atLeast(1), ">= 1"},
				{`kp_userspace_sync_failures_total{ip_family="IPv6"}`, equal(0), "0"},
				// Far below the descriptor limit: nothing refused, and a
				// budget for listeners.
				{`kp_userspace_refused_service_ports`, equal(0), "0"},
				{`kp_userspace_listener_socket_budget`, atLeast(1), ">= 1"},
			}...)
		}
		e.eventually("every metric has a sensible value", 15*time.Second, func() error {
			code, text, err := e.w.HTTPGet(e.w.Node(), "http://"+metricsAddr+"/metrics", 2*time.Second)
			if err != nil || code != 200 {
				return fmt.Errorf("GET /metrics: %d %v", code, err)
			}
			// The checks read now: the scrape may show a sync newer than
			// the moment the checks were built.
			now = float64(time.Now().Unix())
			values := parseMetrics(text)
			var bad []string
			for _, c := range checks {
				v, ok := values[c.series]
				if !ok || !c.ok(v) {
					bad = append(bad, fmt.Sprintf("%s = %v (present %v), want %s", c.series, v, ok, c.want))
				}
			}
			if len(bad) > 0 {
				return fmt.Errorf("%s", strings.Join(bad, "\n"))
			}
			return nil
		})
	})
}

func atLeast(min float64) func(float64) bool { return func(v float64) bool { return v >= min } }
func equal(want float64) func(float64) bool  { return func(v float64) bool { return v == want } }

// parseMetrics reads Prometheus text format into series → value, the
// series written as in the text (name{labels}, labels sorted by name as the
// client library writes them).
func parseMetrics(text string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
