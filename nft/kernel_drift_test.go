package nft

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// TestKernelDriftByAnotherProcessIsReportedAndRepaired: the kernel's change
// events name what another process changed in kp's table (a deleted map
// element, a flushed chain) and who (the nft command), never kp's own
// transactions; the next sync reads the table again and puts back what
// was changed.
func TestKernelDriftByAnotherProcessIsReportedAndRepaired(t *testing.T) {
	ns, fd := testNetns(t)
	cfg := testConfig()
	cfg.DriftCheckPeriod = proxy.DefaultDriftCheckPeriod
	b, err := NewInNamespace(cfg, nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	mustSync(t, b, w.Next())

	// DetectDrift, with its subscription made before the test changes
	// anything.
	nc := b.conn.(*netlinkConn)
	mon, err := nc.subscribe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drifts := make(chan proxy.Drift, 16)
	go func() {
		_ = nc.listen(ctx, mon, func(d proxy.Drift) { b.drifted.Store(true); drifts <- d })
	}()
	noDrift := func(after string) {
		t.Helper()
		select {
		case d := <-drifts:
			t.Fatalf("after %s: drift reported: %+v", after, d)
		case <-time.After(300 * time.Millisecond):
		}
	}
	drift := func(what string) proxy.Drift {
		t.Helper()
		select {
		case d := <-drifts:
			return d
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no drift reported", what)
			return proxy.Drift{}
		}
	}

	w.AddService(statetest.PortName("demo", "api", "http", v1.ProtocolTCP), "10.96.0.11", 80, 0, "10.244.1.4:8080")
	st := w.Next()
	mustSync(t, b, st)
	noDrift("kp's own sync")

	nftIn(t, ns, "delete", "element", "ip", "kp", mapServiceSlots, "{ 10.96.0.10 . tcp . 80 }")
	d := drift("nft delete element")
	if d.What != "ip kp: deleted 1 element of set "+mapServiceSlots || !strings.HasPrefix(d.By, "nft (pid ") || d.Unsure {
		t.Errorf("drift %+v, want the deleted element, by nft", d)
	}
	mustSync(t, b, st)
	if !strings.Contains(nftIn(t, ns, "list", "map", "ip", "kp", mapServiceSlots), "10.96.0.10 . tcp . 80") {
		t.Error("the element is still missing after the sync that follows the drift")
	}
	noDrift("the repair")

	// demo/web's ClusterIP is picked by the shared pick-2.
	chain := regexp.MustCompile(`chain (pick-2) `).FindStringSubmatch(nftIn(t, ns, "list", "table", "ip", "kp"))
	if chain == nil {
		t.Fatalf("no chain pick-2 in:\n%s", nftIn(t, ns, "list", "table", "ip", "kp"))
	}
	before := nftIn(t, ns, "list", "chain", "ip", "kp", chain[1])
	nftIn(t, ns, "flush", "chain", "ip", "kp", chain[1])
	if d := drift("nft flush chain"); !strings.Contains(d.What, "ip kp: deleted") || !strings.Contains(d.What, "of chain "+chain[1]) {
		t.Errorf("drift %+v, want the flushed chain's rules", d)
	}
	mustSync(t, b, st)
	if after := nftIn(t, ns, "list", "chain", "ip", "kp", chain[1]); after != before {
		t.Errorf("chain %s after the repair:\n%s\nwant:\n%s", chain[1], after, before)
	}

	// Another table's changes are none of kp's business.
	nftIn(t, ns, "add", "table", "ip", "other")
	noDrift("a change to another table")
}
