package nft

import (
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
)

var (
	kernelHairpinRE  = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. (\d+\.\d+\.\d+\.\d+)`)
	kernelEndpointRE = regexp.MustCompile(`: (\d+\.\d+\.\d+\.\d+) \. (\d+)`)
)

// TestKernelHairpinSetAndEndpointsMapAcrossRestartsAndResyncs: with the
// hairpin set booked as counts and the endpoints map as the slot table,
// the real kernel's set and map hold exactly the world's pods and
// endpoints across partial syncs, a restart over the table (kp reads it
// back), elements deleted and added behind kp's back and repaired by the
// periodic resync, and Services sharing a pod going one by one. The kernel
// refuses a batch deleting an element that is not there, so a sync that
// believed a stale element present would fail.
func TestKernelHairpinSetAndEndpointsMapAcrossRestartsAndResyncs(t *testing.T) {
	ns, fd, be := kernelBackend(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := newWorld()
	a, b, c := statetest.PortName("ns", "a", "", v1.ProtocolTCP), statetest.PortName("ns", "b", "", v1.ProtocolTCP), statetest.PortName("ns", "c", "", v1.ProtocolTCP)
	check := func(step string) {
		t.Helper()
		var pods, eps []string
		for _, m := range kernelHairpinRE.FindAllStringSubmatch(nftIn(t, ns, "list", "set", "ip", TableName, setHairpin), -1) {
			if m[1] != m[2] {
				t.Errorf("%s: hairpin element %s . %s", step, m[1], m[2])
			}
			pods = append(pods, m[1])
		}
		for _, m := range kernelEndpointRE.FindAllStringSubmatch(nftIn(t, ns, "list", "map", "ip", TableName, mapEndpoints), -1) {
			eps = append(eps, m[1]+":"+m[2])
		}
		slices.Sort(pods)
		slices.Sort(eps)
		var wantEps []string
		for _, list := range w.Endpoints {
			for _, e := range list {
				wantEps = append(wantEps, fmt.Sprintf("%s:%d", e.IP, e.Port))
			}
		}
		slices.Sort(wantEps)
		if want := podsOf(w); !slices.Equal(pods, want) {
			t.Errorf("%s: the kernel's hairpin set holds %v, want %v", step, pods, want)
		}
		if !slices.Equal(eps, wantEps) {
			t.Errorf("%s: the kernel's endpoints map holds %v, want %v", step, eps, wantEps)
		}
	}
	sync := func(step string) {
		t.Helper()
		be.now = func() time.Time { return now }
		if err := be.Sync(t.Context(), w.Next()); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		check(step)
	}
	w.AddService(a, "10.96.0.1", 80, 0, "10.244.0.1:80", "10.244.0.2:80")
	w.AddService(b, "10.96.0.2", 80, 0, "10.244.0.1:8080", "10.244.0.3:8080")
	sync("first sync")

	var err error
	if be, err = NewInNamespace(testConfig(), nil, fd); err != nil {
		t.Fatal(err)
	}
	w.AddService(c, "10.96.0.3", 80, 0, "10.244.0.3:80", "10.244.0.4:80")
	sync("a restart over the table, with a Service more")

	w.SetEndpoints(a, "10.244.0.1:80", "10.244.0.5:80")
	sync("an endpoint replaced")

	nftIn(t, ns, "delete", "element", "ip", TableName, setHairpin, "{ 10.244.0.1 . 10.244.0.1 }")
	nftIn(t, ns, "add", "element", "ip", TableName, setHairpin, "{ 10.244.9.9 . 10.244.9.9 }")
	nftIn(t, ns, "delete", "element", "ip", TableName, mapEndpoints, "{ 0x00000008 }")
	now = now.Add(fullSyncInterval + time.Minute)
	sync("the periodic resync after edits behind kp's back")

	w.Remove(a)
	sync("a Service sharing a pod goes")
	w.Remove(b)
	sync("the other goes")
	w.Remove(c)
	sync("the last goes")
}
