package proxy

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy/proxytest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestServiceCIDRsInTheState(t *testing.T) {
	var logs bytes.Buffer
	tr := NewChangeTracker(ChangeTrackerOptions{
		NodeName:     "node-a",
		Log:          slog.New(slog.NewTextHandler(&logs, nil)),
		Clock:        clocktesting.NewFakePassiveClock(trackerStart),
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
	})
	notified := 0
	tr.onChange = func() { notified++ }
	steps := []struct {
		name        string
		change      func()
		want        string
		wantChanged bool
		wantNotify  int
	}{
		{"the flag's CIDRs from the start", func() {}, "[10.96.0.0/16]", true, 0},
		{"nothing changed", func() {}, "[10.96.0.0/16]", false, 0},
		{"a dual-stack ServiceCIDR object, sorted and masked",
			func() {
				tr.OnServiceCIDR("kubernetes", proxytest.ServiceCIDR("kubernetes", "fd00:96::/112", "10.100.0.5/16"))
			},
			"[10.96.0.0/16 10.100.0.0/16 fd00:96::/112]", true, 1},
		{"a second object repeating a CIDR",
			func() {
				tr.OnServiceCIDR("extra", proxytest.ServiceCIDR("extra", "10.100.0.0/16", "bad", "10.200.0.0/24"))
			},
			"[10.96.0.0/16 10.100.0.0/16 10.200.0.0/24 fd00:96::/112]", true, 2},
		{"the same object again: no change",
			func() {
				tr.OnServiceCIDR("extra", proxytest.ServiceCIDR("extra", "10.100.0.0/16", "bad", "10.200.0.0/24"))
			},
			"[10.96.0.0/16 10.100.0.0/16 10.200.0.0/24 fd00:96::/112]", false, 2},
		{"an object being deleted still counts (as upstream kube-proxy)",
			func() {
				c := proxytest.ServiceCIDR("extra", "10.100.0.0/16", "bad", "10.200.0.0/24")
				c.DeletionTimestamp = &metav1.Time{Time: trackerStart}
				tr.OnServiceCIDR("extra", c)
			},
			"[10.96.0.0/16 10.100.0.0/16 10.200.0.0/24 fd00:96::/112]", false, 2},
		{"deleting the first object keeps the CIDR the second shares",
			func() { tr.OnServiceCIDR("kubernetes", nil) },
			"[10.96.0.0/16 10.100.0.0/16 10.200.0.0/24]", true, 3},
	}
	for _, s := range steps {
		s.change()
		st := tr.Snapshot()
		if got := fmt.Sprint(st.ServiceCIDRs); got != s.want || st.ServiceCIDRsChanged != s.wantChanged || notified != s.wantNotify {
			t.Errorf("%s: ServiceCIDRs %s changed %v notified %d; want %s %v %d", s.name, got, st.ServiceCIDRsChanged,
				notified, s.want, s.wantChanged, s.wantNotify)
		}
	}
	if out := logs.String(); strings.Count(out, "spec.cidrs[1]") != 1 || !strings.Contains(out, "kind=ServiceCIDR") ||
		!strings.Contains(out, "object=extra") {
		t.Errorf("want the bad CIDR logged once with kind, object and field; got:\n%s", out)
	}
}
