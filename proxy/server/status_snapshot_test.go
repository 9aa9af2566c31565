package server

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// listingBackend lists rules and answers NodePorts on a CIDR.
type listingBackend struct{ countingBackend }

func (*listingBackend) ListRules(context.Context) ([]proxy.RuleListing, error) {
	return []proxy.RuleListing{{Where: "nftables ip kp", Format: "nft", Text: "table ip kp {\n}\n"}}, nil
}

func (*listingBackend) NodePortScope() ([]netip.Prefix, bool) {
	return []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, false
}

func TestSnapshotCarriesTheModelTheSettingsTheRulesAndWhatCmdAdds(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := NewStatus(&listingBackend{}, "node-a", nil, clk)
	s.SetBuild(statusapi.Build{Version: "v0.1.0"})
	cfg := proxy.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, MasqueradeAll: true}
	s.SetSnapshot(cfg, func(_ context.Context, st *proxy.State, snap *statusapi.Snapshot) {
		if st == nil {
			t.Error("the facts hook got no State")
		}
		snap.Proxy.NodePortIPs = []string{"10.0.0.5"}
	})
	st := statusTestState()
	st.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	s.Succeeded(st, clk.Now(), clk.Now(), true)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	snap, err := (&statusapi.Client{BaseURL: srv.URL}).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p := snap.Proxy
	if snap.Format != statusapi.SnapshotFormat || snap.Build == nil || snap.Build.Version != "v0.1.0" || snap.Mode != "nftables" ||
		len(snap.Services.ServicePorts) != 2 || len(snap.Services.ServiceCIDRs) != 1 {
		t.Errorf("snapshot: %+v", snap)
	}
	if p.DetectLocalMode != "ClusterCIDR" || len(p.LocalCIDRs) != 1 || !p.MasqueradeAll || len(p.NodePortAddresses) != 1 ||
		p.NodePortPrimary || len(p.NodePortIPs) != 1 {
		t.Errorf("proxy facts: %+v", p)
	}
	if len(snap.Rules) != 1 || snap.Rules[0].Format != "nft" || snap.RulesError != "" {
		t.Errorf("rules %+v, error %q", snap.Rules, snap.RulesError)
	}
	// What the snapshot holds is what kp explain rebuilds the State from.
	back, err := statusapi.StateFromServices(&snap.Services)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Services) != len(st.Services) || len(back.ServiceCIDRs) != 1 {
		t.Errorf("rebuilt State: %d service ports, CIDRs %v", len(back.Services), back.ServiceCIDRs)
	}
}

func TestSnapshotSaysWhyAModeListsNoRules(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	s := NewStatus(&countingBackend{}, "node-a", nil, clk)
	if snap := s.Snapshot(context.Background()); snap.RulesError == "" || snap.Services.Generation != 0 {
		t.Errorf("rules error %q, generation %d", snap.RulesError, snap.Services.Generation)
	}
}
