package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
	"net/netip"
)

const programmingCount = "kubeproxy_network_programming_duration_seconds_count"

func TestKubeServicesAndSlicesWrittenThroughClientGoReachTheTraffic(t *testing.T) {
	k := newKubeEnv(t, modeNFTables, 4, apiserver.Options{})
	pods := k.w.Pods()
	client := pods[3]
	k.apply(web(pods[:3]...))
	k.startKP()
	names := k.podNames(pods[:3]...)
	k.answers(client.NS, "tcp", webTCP, names...)
	k.answers(k.w.Client(), "udp", webUDP, names...)

	// Updated slices: a removed endpoint gets no new connection. The
	// slices' trigger time makes the change's programming latency
	// measured (changes from before kp started are not, as upstream).
	before := k.metric(programmingCount)
	k.apply(web(pods[0], pods[1]))
	removed := pods[2].Name
	k.eventually(removed+" no longer chosen", 15*time.Second, func() error {
		counts, err := k.answered(client.NS, "tcp", webTCP, 30)
		if err == nil && counts[removed] > 0 {
			err = fmt.Errorf("answers %v", counts)
		}
		return err
	})
	if counts := k.spread(t, client.NS, "tcp", webTCP, 100); counts[removed] > 0 || len(counts) != 2 {
		t.Errorf("after removing %s from the slices: %v", removed, counts)
	}
	k.eventually("the update's network programming latency observed", 15*time.Second, func() error {
		if n := k.metric(programmingCount); n <= before {
			return fmt.Errorf("%s = %v, was %v", programmingCount, n, before)
		}
		return nil
	})

	// An updated Service: a new port.
	svc := web(pods[0])
	svc.Ports = append(svc.Ports, Port{Name: "alt", Port: 81, TargetPort: 8081})
	k.apply(svc)
	k.answers(client.NS, "tcp", "10.96.0.10:81", pods[0].Name)

	// Deleted slices: the Service has no endpoint left and refuses.
	k.deleteSlices(svc, nil)
	k.eventually("a Service whose slices are deleted refuses", 15*time.Second, func() error {
		if _, err := k.ask(k.w.Client(), "tcp", webTCP); !isRefused(err) {
			return fmt.Errorf("got %v, want connection refused", err)
		}
		return nil
	})

	// A deleted Service no longer answers.
	k.apply(svc)
	k.answers(client.NS, "tcp", webTCP, pods[0].Name)
	k.remove(svc)
	k.eventually("deleted Service stops answering", 15*time.Second, func() error {
		return k.silent(k.w.Client(), "tcp", webTCP)
	})
}

func TestKubeServicesOfAnotherProxyAndHeadlessServicesAreIgnored(t *testing.T) {
	netns.Require(t, "nft")
	k := newKubeEnv(t, modeNFTables, 2, apiserver.Options{})
	pods := k.w.Pods()
	port := []Port{{Name: "http", Port: 80, TargetPort: 8080}}
	otherProxy := Service{Name: "other-proxy", ClusterIPs: []string{"10.96.0.60"}, Ports: port, Endpoints: endpoints(pods...)}
	// The endpointslice controller copies a Service's labels to its slices,
	// and marks a headless Service's slices.
	k.apply(otherProxy, labelled(proxy.LabelServiceProxyName, "someone-else"))
	headless := Service{Name: "headless", ClusterIPs: []string{v1.ClusterIPNone}, Ports: port, Endpoints: endpoints(pods...)}
	k.apply(headless, func(o metav1.Object) {
		if _, ok := o.(*discovery.EndpointSlice); ok {
			labelled(v1.IsHeadlessService, "")(o)
		}
	})
	k.apply(web(pods...))
	k.startKP()
	k.answers(k.w.Client(), "tcp", webTCP)

	out, err := k.w.NFT("list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset: %v", err)
	}
	for _, s := range []string{"e2e/other-proxy", "e2e/headless", "10.96.0.60"} {
		if strings.Contains(out, s) {
			t.Errorf("the ruleset mentions %s, which kp must ignore", s)
		}
	}
	if err := k.silent(k.w.Client(), "tcp", "10.96.0.60:80"); err != nil {
		t.Errorf("the other proxy's Service: %v", err)
	}

	// The label moves: web is handed to another proxy, other-proxy comes
	// back to kp (server-side apply drops the label the test owned).
	k.apply(web(pods...), labelled(proxy.LabelServiceProxyName, "someone-else"))
	k.apply(otherProxy)
	k.answers(k.w.Client(), "tcp", "10.96.0.60:80")
	k.eventually("web, now another proxy's, stops answering", 15*time.Second, func() error {
		return k.silent(k.w.Client(), "tcp", webTCP)
	})
}

func TestKubeKubernetesServiceReachesTheAPIServerFromPods(t *testing.T) {
	k := newKubeEnv(t, modeNFTables, 1, apiserver.Options{})
	k.startKP()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.srv.CA())
	// The API server publishes the default/kubernetes Service's endpoint
	// itself; kp programs it like any other.
	for _, ns := range []string{k.w.Pods()[0].NS, k.w.Node()} {
		k.eventually("TLS to the API server through 10.96.0.1:443 from "+ns, 30*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			c, err := netns.DialConn(ctx, ns, "tcp", "10.96.0.1:443")
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			// The serving certificate names 10.96.0.1: the handshake
			// proves the real API server answered.
			tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "10.96.0.1"})
			return tc.HandshakeContext(ctx)
		})
	}
}

func TestKubeNodeZoneLabelChangeIsPickedUp(t *testing.T) {
	k := newKubeEnv(t, modeNFTables, 3, apiserver.Options{})
	pods := k.w.Pods()
	client := pods[2]
	// One endpoint hinted for each zone: which one answers says which
	// zone kp believes its node is in.
	svc := web()
	svc.Endpoints = []Endpoint{
		{IP: pods[0].IP.String(), NodeName: nodeName, Zone: "zone-a", ZoneHints: []string{"zone-a"}},
		{IP: pods[1].IP.String(), NodeName: nodeName, Zone: "zone-b", ZoneHints: []string{"zone-b"}},
	}
	k.apply(svc)
	k.startKP()
	k.inZone("zone-a")
	k.only(t, client.NS, "tcp", webTCP, 30, pods[0].Name)

	k.patchNodeZone("zone-b")
	k.inZone("zone-b")
	k.eventually("traffic keeps to zone-b's endpoint", 15*time.Second, func() error {
		counts, err := k.answered(client.NS, "tcp", webTCP, 20)
		if err == nil && counts[pods[1].Name] != 20 {
			err = fmt.Errorf("answers %v", counts)
		}
		return err
	})
}

func TestKubeStartedWhileAPIServerIsDownWaitsRetriesAndRecovers(t *testing.T) {
	k := newKubeEnv(t, modeNFTables, 2, apiserver.Options{})
	pods := k.w.Pods()
	k.apply(web(pods...))
	inst := k.srv.Instance(0)
	if err := inst.Stop(); err != nil {
		t.Fatalf("stop the API server: %v", err)
	}
	k.launchKP()

	// kp keeps waiting (and says so every 10 s), serving /healthz as
	// not ready, and never exits.
	url := "http://" + healthzAddr + "/healthz"
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		code, body, err := k.w.HTTPGet(k.w.Node(), url, time.Second)
		if err == nil && code != 503 {
			t.Fatalf("/healthz before the first sync: %d %s, want 503", code, body)
		}
		if !k.kp.Running() {
			t.Fatalf("kp exited while the API server was down: %v", k.kp.ExitErr())
		}
		time.Sleep(500 * time.Millisecond)
	}
	code, _, err := k.w.HTTPGet(k.w.Node(), url, time.Second)
	if err != nil || code != 503 {
		t.Errorf("/healthz while waiting: %d, %v; want 503", code, err)
	}
	k.logShows("kp says it waits for the API server", 15*time.Second, "waiting for the API server")

	if err := inst.Start(); err != nil {
		t.Fatalf("start the API server again: %v", err)
	}
	k.waitHealthy()
	k.answers(k.w.Client(), "tcp", webTCP, k.podNames(pods...)...)
}

// Not parallel: the outage must last 30 s of real time while traffic is
// measured, without competing with the other tests.
func TestKubeAPIServerOutageDropsNoConnectionAndChangesMadeMeanwhileLandAfter(t *testing.T) {
	netns.Require(t, "nft")
	apiserver.Bin(t, apiserver.KubeAPIServer)
	// Two instances on one etcd, as in an HA control plane: kp talks to
	// the first, which is stopped; the test writes through the second.
	k := newKubeEnvSerial(t, modeNFTables, 4, apiserver.Options{Instances: 2})
	pods := k.w.Pods()
	client := pods[3]
	port := []Port{{Name: "http", Port: 80, TargetPort: 8080}}
	gone := Service{Name: "gone", ClusterIPs: []string{"10.96.0.71"}, Ports: port, Endpoints: endpoints(pods[2])}
	late := Service{Name: "late", ClusterIPs: []string{"10.96.0.70"}, Ports: port, Endpoints: endpoints(pods[0])}
	k.apply(web(pods[0], pods[1]))
	k.apply(gone)
	k.startKP()
	k.answers(client.NS, "tcp", webTCP)
	k.answers(client.NS, "tcp", "10.96.0.71:80", pods[2].Name)
	fullBefore := k.metric("kubeproxy_sync_full_proxy_rules_duration_seconds_count")
	if fullBefore == 0 {
		t.Fatalf("no full sync counted, not even kp's first")
	}
	handlesBefore := k.nftHandles()
	pid := k.kp.Pid()

	// Traffic all along: a new connection every 50 ms from a pod to the
	// ClusterIP and from the off-node client over UDP.
	var total, failed atomic.Int64
	var failures []string
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range []struct{ ns, network, addr string }{
		{client.NS, "tcp", webTCP},
		{k.w.Client(), "udp", webUDP},
	} {
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				total.Add(1)
				if _, err := k.ask(c.ns, c.network, c.addr); err != nil {
					failed.Add(1)
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s %s %s: %v", time.Now().Format("15:04:05.000"), c.network, c.addr, err))
					mu.Unlock()
				}
			}
		})
	}

	down := k.srv.Instance(0)
	if err := down.Stop(); err != nil {
		t.Fatalf("stop kp's API server: %v", err)
	}
	stopped := time.Now()
	t.Logf("kp's API server stopped at %s", stopped.Format("15:04:05.000"))
	// Changes kp cannot see yet.
	k.apply(web(pods[1], pods[2]))
	k.apply(late)
	k.remove(gone)
	if err := k.silent(client.NS, "tcp", "10.96.0.70:80"); err != nil {
		t.Errorf("a Service created while kp is cut off: %v", err)
	}
	time.Sleep(time.Until(stopped.Add(30 * time.Second)))
	if !k.kp.Running() || k.kp.Pid() != pid {
		t.Fatalf("kp did not survive the outage: running %v, pid %d (was %d), %v", k.kp.Running(), k.kp.Pid(), pid, k.kp.ExitErr())
	}
	if err := down.Start(); err != nil {
		t.Fatalf("start kp's API server again: %v", err)
	}
	t.Logf("kp's API server back at %s", time.Now().Format("15:04:05.000"))

	// client-go's reflectors (kp's as upstream kube-proxy's) retry a
	// refused watch with a backoff that doubles from 0.8 s to 30 s with
	// jitter up to as much again: the retry in flight when the server
	// comes back may wait up to 60 s. The restarted server's watch cache
	// starts at etcd's current revision, so the resumed watch is too old
	// (410) and the reflector relists after one more backoff of up to
	// 60 s. A run measured Services relisted 48 s after the server came
	// back and EndpointSlices not within 90 s; the bound is the sum.
	k.eventually("the Service created meanwhile answers", 150*time.Second, func() error {
		name, err := k.ask(client.NS, "tcp", "10.96.0.70:80")
		if err == nil && name != pods[0].Name {
			err = fmt.Errorf("answered by %s, want %s", name, pods[0].Name)
		}
		return err
	})
	k.eventually("the deleted Service stops answering", 30*time.Second, func() error {
		return k.silent(client.NS, "tcp", "10.96.0.71:80")
	})
	k.eventually(pods[0].Name+" leaves web", 30*time.Second, func() error {
		counts, err := k.answered(client.NS, "tcp", webTCP, 20)
		if err == nil && counts[pods[0].Name] > 0 {
			err = fmt.Errorf("answers %v", counts)
		}
		return err
	})
	close(stop)
	wg.Wait()

	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d connections failed across the API server outage:\n%s", n, total.Load(), strings.Join(failures, "\n"))
	} else {
		t.Logf("%d connections across the outage, none failed", total.Load())
	}
	if full := k.metric("kubeproxy_sync_full_proxy_rules_duration_seconds_count"); full != fullBefore {
		t.Errorf("full syncs: %v before the outage, %v after; the reconnection must not rebuild the rules", fullBefore, full)
	}
	// Nothing kp had was recreated: the tables and every chain that
	// existed before keep their kernel handles.
	after := k.nftHandles()
	for name, h := range handlesBefore {
		switch {
		case strings.Contains(name, "e2e/gone"):
			continue // deleted on purpose
		case strings.Contains(name, pods[0].IP.String()):
			continue // pod-0's endpoint in web went with it
		case strings.Contains(name, "default/kubernetes"):
			// The stopped instance withdrew itself from the kubernetes
			// Service's endpoints and came back: a real change.
			continue
		}
		if after[name] != h {
			t.Errorf("%s: handle %d before the outage, %d after: recreated", name, h, after[name])
		}
	}
}

var handleRE = regexp.MustCompile(`^\s*(table|chain|map|set|counter) (\S+(?: \S+)?) \{ # handle (\d+)`)

// nftHandles maps each of kp's nftables objects ("table ip kp", "chain ip
// svc-…") to its kernel handle. An object deleted and created again gets a
// new handle; one kept in place keeps its handle.
func (e *env) nftHandles() map[string]int {
	e.t.Helper()
	handles := map[string]int{}
	for _, family := range []string{"ip", "ip6"} {
		out, err := e.w.NFT("-a", "list", "table", family, "kp")
		if err != nil {
			e.t.Fatalf("nft -a list table %s kp: %v", family, err)
		}
		for _, line := range strings.Split(out, "\n") {
			m := handleRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			var h int
			fmt.Sscan(m[3], &h)
			handles[m[1]+" "+family+" "+m[2]] = h
		}
	}
	if len(handles) == 0 {
		e.t.Fatalf("no nftables objects with handles in kp's tables")
	}
	return handles
}

// The API server makes a ServiceCIDR object ("kubernetes") of its
// --service-cluster-ip-range; kp watches ServiceCIDRs and drops traffic to
// addresses in them that no Service has.
func TestKubeUnallocatedAddressesOfTheClustersServiceCIDRsAreDropped(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		k := newKubeEnv(t, m, 2, apiserver.Options{})
		pods := k.w.Pods()
		k.apply(web(pods...))
		k.startKP()
		k.answers(k.w.Client(), "tcp", webTCP)
		for _, c := range []struct{ family, cidr, addr string }{
			{"ip", netns.ServiceCIDR.String(), "10.96.0.77:80"},
			{"ip6", netns.ServiceCIDR6.String(), "[fd00:96::77]:80"},
		} {
			k.eventually("kp has the ServiceCIDR "+c.cidr, 30*time.Second, func() error {
				if !m.iptables() && !m.userspace && !m.ipvs {
					out, err := k.w.NFT("list", "set", c.family, "kp", "service-cidrs")
					if err != nil || !strings.Contains(out, c.cidr) {
						return fmt.Errorf("set service-cidrs: %v\n%s", err, out)
					}
					return nil
				}
				// iptables and userspace modes: a rule of kp's for the CIDR.
				out, err := k.listRules()
				if err != nil || !strings.Contains(out, c.cidr) {
					return fmt.Errorf("no rule of kp's names %s: %v\n%s", c.cidr, err, out)
				}
				return nil
			})
			if err := k.dropped(k.w.Client(), "tcp", c.addr); err != nil {
				t.Errorf("unallocated service address: %v", err)
			}
			k.notForwarded(t, netip.MustParseAddrPort(c.addr).Addr())
		}
	})
}
