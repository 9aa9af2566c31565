package nft

import (
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

func TestPortsSharingAClusterIPKeepItInClusterIPsUntilTheLastGoes(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	http, admin := statetest.PortName("a", "web", "http", v1.ProtocolTCP), statetest.PortName("a", "web", "admin", v1.ProtocolTCP)
	w.AddService(http, "10.96.0.5", 80, 0, "10.244.0.1:80")
	w.AddService(admin, "10.96.0.5", 9000, 0, "10.244.0.1:9000")
	mustSync(t, b, w.Next())

	w.Remove(admin)
	mustSync(t, b, w.Next())
	if !strings.Contains(fake.Dump(), "set cluster-ips { 10.96.0.5 }") {
		t.Errorf("one port of two removed, the ClusterIP left cluster-ips:\n%s", fake.Dump())
	}
	w.Remove(http)
	mustSync(t, b, w.Next())
	if strings.Contains(fake.Dump(), "10.96.0.5") {
		t.Errorf("both ports removed, the ClusterIP stayed:\n%s", fake.Dump())
	}
}

func TestTwoServicesClaimingOneAddressResolveTheSameWayAndSurviveEitherGoing(t *testing.T) {
	first, second := statetest.PortName("a", "first", "", v1.ProtocolTCP), statetest.PortName("b", "second", "", v1.ProtocolTCP)
	build := func(order ...proxy.ServicePortName) (*Fake, *Backend, *statetest.World) {
		fake := NewFake()
		b := newFakeBackend(t, fake)
		w := newWorld()
		for _, n := range order {
			w.AddService(n, "10.96.0.7", 80, 0, "10.244.0."+map[bool]string{true: "1", false: "2"}[n == first]+":80")
			mustSync(t, b, w.Next()) // one sync per Service: arrival order differs
		}
		return fake, b, w
	}
	// Both are plain: the address's service-slots element is the
	// winner's (one endpoint, its slot), whose slot holds the winner's
	// endpoint.
	picks := func(f *Fake, ep string) bool {
		dump := f.Dump()
		m := regexp.MustCompile(`10\.96\.0\.7 \. tcp \. 80 : 0x01([0-9a-f]{6})`).FindStringSubmatch(dump)
		return m != nil && regexp.MustCompile(`set endpoints \{[^}]*0x00`+m[1]+` : `+regexp.QuoteMeta(ep)+` . 80`).MatchString(dump)
	}
	fake1, _, _ := build(first, second)
	fake2, b2, w2 := build(second, first)
	for i, f := range []*Fake{fake1, fake2} {
		if !picks(f, "10.244.0.1") {
			t.Errorf("arrival order %d: the conflict did not resolve to the first Service by name:\n%s", i, f.Dump())
		}
	}
	// The winner goes: the other takes the address over, and the
	// transaction deleting the winner's objects is accepted.
	w2.Remove(first)
	mustSync(t, b2, w2.Next())
	if !picks(fake2, "10.244.0.2") {
		t.Errorf("the remaining Service did not take the address over:\n%s", fake2.Dump())
	}
}

func TestAffinityTimeoutChangeDeclaresTheSetsAnew(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	n := statetest.PortName("a", "sticky", "", v1.ProtocolTCP)
	w.AddService(n, "10.96.0.8", 80, 0, "10.244.0.1:80", "10.244.0.2:80")
	sp := *w.Services[n]
	sp.AffinityTimeout = time.Hour
	w.Services[n] = &sp
	mustSync(t, b, w.Next())
	set := "affinity-a/sticky/tcp/80__10.244.0.1/80"
	if s := fake.Tables["ip"].Sets[set]; s == nil || !s.Dynamic || s.Timeout != time.Hour {
		t.Fatalf("affinity set %s = %+v", set, s)
	}
	sp2 := sp
	sp2.AffinityTimeout = 10 * time.Second
	w.Services[n] = &sp2
	w.Changed[n] = struct{}{}
	mustSync(t, b, w.Next())
	if s := fake.Tables["ip"].Sets[set]; s == nil || s.Timeout != 10*time.Second {
		t.Errorf("after the timeout changed, %s = %+v", set, s)
	}
	sp3 := sp2
	sp3.AffinityTimeout = 0
	w.Services[n] = &sp3
	w.Changed[n] = struct{}{}
	mustSync(t, b, w.Next())
	if strings.Contains(fake.Dump(), "affinity") || fake.Tables["ip"].Sets[set] != nil {
		t.Errorf("affinity switched off left its sets or rules:\n%s", fake.Dump())
	}
}

func TestPolicyWithoutEndpointsDropsWhenOthersHaveSome(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	n := statetest.PortName("a", "local", "", v1.ProtocolTCP)
	w.AddService(n, "10.96.0.9", 80, 30009, "10.244.0.1:80")
	sp := *w.Services[n]
	sp.Type, sp.ExternalPolicyLocal, sp.InternalPolicyLocal = v1.ServiceTypeNodePort, true, true
	w.Services[n] = &sp
	mustSync(t, b, w.Next()) // the endpoint has no nodeName: not local
	dump := fake.Dump()
	for _, want := range []string{"10.96.0.9 . tcp . 80 : drop", "tcp . 30009 : drop"} {
		if !strings.Contains(dump, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, dump)
		}
	}
	if strings.Contains(dump, "reject-chain }") || strings.Contains(dump, ": goto reject-chain") {
		t.Errorf("endpoints elsewhere, yet rejected:\n%s", dump)
	}
}

func TestPeriodicFullSyncRepairsWhatChangedBehindKpsBack(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b.now = func() time.Time { return now }
	w := newWorld()
	w.AddService(statetest.PortName("a", "web", "", v1.ProtocolTCP), "10.96.0.4", 80, 0, "10.244.0.1:80")
	mustSync(t, b, w.Next())
	want := fake.Dump()

	// Someone flushes kp's service chain and deletes its map element.
	ip := fake.Tables["ip"]
	ip.Chains["svc-a/web/tcp/80"] = nil
	for k, e := range ip.Elements[mapServiceIPs] {
		if strings.HasPrefix(e.KeyText, "10.96.0.4") {
			delete(ip.Elements[mapServiceIPs], k)
		}
	}
	mustSync(t, b, w.Next())
	if fake.Dump() == want {
		t.Fatal("test broken: the tampering was repaired before the safety net was due")
	}
	now = now.Add(fullSyncInterval + time.Minute)
	mustSync(t, b, w.Next())
	if got := fake.Dump(); got != want {
		t.Errorf("the periodic full sync did not repair the table:\n--- got ---\n%s\n--- want ---\n%s", got, want)
	}
}
