package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"

	"github.com/kpproxy/kp/test/netns"
)

// TestBadObjectsAreLoggedAndSkippedWhileTheRestWorks fills the manifests
// folder with objects that each have a bad field (the list), next to
// many good Services and one of 5,000 endpoints. Every bad object is logged
// with its kind, name and field; the usable parts of the bad objects work;
// a sample of the good Services, the large one among them, answers.
func TestBadObjectsAreLoggedAndSkippedWhileTheRestWorks(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		e.write("web.yaml", web(pods...))

		http := func(name string) Port { return Port{Name: name, Port: 80, TargetPort: 8080} }
		// The wrong-family slice: an IPv6 address in an IPv4 slice, before a
		// good IPv4 one.
		fam := Service{Name: "fam", ClusterIPs: []string{"10.96.0.72"}, Ports: []Port{http("http")},
			Endpoints: podsOn(nodeName, pods[1])}.Objects()
		famSlice := fam[1].(*discovery.EndpointSlice)
		famSlice.Endpoints = append([]discovery.Endpoint{{Addresses: []string{pods[0].IP6.String()}}}, famSlice.Endpoints...)
		// The same endpoint in two slices of one Service.
		dup := Service{Name: "dup", ClusterIPs: []string{"10.96.0.73"}, Ports: []Port{http("http")},
			Endpoints: podsOn(nodeName, pods[2])}.Objects()
		dupCopy := dup[1].(*discovery.EndpointSlice).DeepCopy()
		dupCopy.Name += "-copy"

		objs := []any{
			Service{Name: "bad-ip", ClusterIPs: []string{"10.96.0.300"}, Ports: []Port{http("http")}, Endpoints: podsOn(nodeName, pods[0])},
			Service{Name: "bad-ports", ClusterIPs: []string{"10.96.0.71"}, Ports: []Port{
				{Name: "zero", Port: 0, TargetPort: 8080},
				{Name: "huge", Port: 70000, TargetPort: 8080},
				http("ok"),
			}, Endpoints: podsOn(nodeName, pods[0])},
			Service{Name: "bad-proto", ClusterIPs: []string{"10.96.0.74"},
				Ports: []Port{{Name: "q", Protocol: "QUIC", Port: 80, TargetPort: 8080}}},
			Service{Name: "Bad_Name", ClusterIPs: []string{"10.96.0.75"}, Ports: []Port{http("http")}, NoSlices: true},
		}
		objs = append(objs, fam...)
		objs = append(objs, dup...)
		objs = append(objs, dupCopy)
		e.write("bad.yaml", objs...)
		// Many good Services beside the bad objects, and one of 5,000
		// endpoints.
		const goodServices = 60
		var good []any
		for i := 0; i < goodServices; i++ {
			good = append(good, Service{Name: fmt.Sprintf("good-%d", i), ClusterIPs: []string{fmt.Sprintf("10.96.2.%d", 10+i)},
				Ports: []Port{http("http")}, Endpoints: podsOn(nodeName, pods...)})
		}
		e.write("good.yaml", good...)
		large := m.claims(featureLargeService)
		if large {
			e.write("large.yaml", largeService(t, e, pods[0], 5000)...)
		} else {
			t.Logf("%s mode does not claim %s: %s", m.name, featureLargeService, unclaimed[m.name][featureLargeService])
		}
		e.startKP()

		e.answers(e.w.Client(), "tcp", webTCP)
		for _, i := range []int{0, goodServices / 2, goodServices - 1} {
			e.answers(pods[1].NS, "tcp", fmt.Sprintf("10.96.2.%d:80", 10+i), e.podNames(pods...)...)
		}
		// Every request to the large Service answered: whichever of its
		// 5,000 endpoints it goes to, pod-0 holds the address.
		if large {
			e.answers(pods[1].NS, "tcp", largeTCP, pods[0].Name)
			e.askEvery(t, pods[1].NS, "tcp", largeTCP, 50, pods[0].Name)
		}
		if logHas(e.kp.Log(), `object="e2e/large"`) || logHas(e.kp.Log(), `object="e2e/good-0"`) {
			t.Errorf("kp logged a good Service as an error:\n%s", e.kp.Log())
		}
		e.answers(e.w.Client(), "tcp", "10.96.0.71:80", pods[0].Name) // bad-ports' good port
		e.answers(e.w.Client(), "tcp", "10.96.0.72:80", pods[1].Name) // fam's IPv4 endpoint
		for i := 0; i < 10; i++ {
			if name, err := e.ask(e.w.Client(), "tcp", "10.96.0.73:80"); err != nil || name != pods[2].Name {
				t.Fatalf("dup: %q %v, want %s every time", name, err, pods[2].Name)
			}
		}

		wantLogged := [][3]string{
			{"Service", "e2e/bad-ip", "spec.clusterIPs[0]"},
			{"Service", "e2e/bad-ports", "spec.ports[0].port"},
			{"Service", "e2e/bad-ports", "spec.ports[1].port"},
			{"Service", "e2e/bad-proto", "spec.ports[0].protocol"},
			{"Service", "e2e/Bad_Name", "metadata.name"},
			{"EndpointSlice", "e2e/" + famSlice.Name, "endpoints[0].addresses[0]"},
			{"EndpointSlice", "e2e/bad-proto-ipv4-0", "ports[0].protocol"},
		}
		e.eventually("every bad object logged with kind, object and field", 10*time.Second, func() error {
			var missing []string
			for _, w := range wantLogged {
				if !logHas(e.kp.Log(), `kind="`+w[0]+`"`, `object="`+w[1]+`"`, `field="`+w[2]+`"`) {
					missing = append(missing, strings.Join(w[:], " "))
				}
			}
			if len(missing) > 0 {
				return fmt.Errorf("kp's log lacks:\n%s\nlog:\n%s", strings.Join(missing, "\n"), e.kp.Log())
			}
			return nil
		})
		// The same endpoint twice is not an error.
		if logHas(e.kp.Log(), `object="e2e/dup"`) {
			t.Errorf("kp logged the duplicate endpoint as an error:\n%s", e.kp.Log())
		}
		if !e.kp.Running() {
			t.Fatalf("kp exited: %v", e.kp.ExitErr())
		}
	})
}

// logHas reports whether one line of log contains every part.
func logHas(log string, parts ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			if !strings.Contains(line+" ", p+" ") {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// largeTCP is largeService's ClusterIP and port.
const largeTCP = "10.96.0.76:80"

// largeService is a Service of n endpoints (TCP 80 → 8080) in EndpointSlices
// of 1,000, the API's limit per slice, every one of whose addresses pod
// answers on: the node routes 10.X.64.0/19 to pod, which holds the whole
// range as local addresses (a local route on its loopback), so its echo
// server accepts a connection to any of them.
func largeService(t *testing.T, e *env, pod *netns.Pod, n int) []any {
	t.Helper()
	if n > 250*32 {
		t.Fatalf("largeService: %d endpoints do not fit a /19", n)
	}
	prefix := fmt.Sprintf("10.%d.64.0/19", e.w.Index())
	for _, c := range []struct {
		ns  string
		cmd []string
	}{
		{pod.NS, []string{"ip", "route", "add", "local", prefix, "dev", "lo"}},
		{e.w.Node(), []string{"ip", "route", "add", prefix, "via", pod.IP.String()}},
	} {
		if out, err := e.w.Exec(c.ns, c.cmd...); err != nil {
			t.Fatalf("route %s for the large Service: %s: %v\n%s", prefix, strings.Join(c.cmd, " "), err, out)
		}
	}
	var eps []Endpoint
	for i := 0; i < n; i++ {
		eps = append(eps, Endpoint{IP: fmt.Sprintf("10.%d.%d.%d", e.w.Index(), 64+i/250, 1+i%250), NodeName: nodeName})
	}
	objs := Service{Name: "large", ClusterIPs: []string{"10.96.0.76"},
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: eps}.Objects()
	whole := objs[1].(*discovery.EndpointSlice)
	out := objs[:1:1]
	for k := 0; k*1000 < len(whole.Endpoints); k++ {
		sl := whole.DeepCopy()
		sl.Name = fmt.Sprintf("large-ipv4-%d", k)
		sl.Endpoints = whole.Endpoints[k*1000 : min((k+1)*1000, len(whole.Endpoints))]
		out = append(out, sl)
	}
	return out
}
