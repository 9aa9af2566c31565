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

// TestKernelAnOverflowOfKpsOwnTransactionsIsNoDrift: kp's own full sync of
// a large table overflows the monitor's socket; the generations it heard
// nothing of are all kp's, so that is no drift (the next sync would read the
// whole table again, which is quadratic in its sets' sizes). An overflow
// that hides another process's transaction is drift, unsure.
func TestKernelAnOverflowOfKpsOwnTransactionsIsNoDrift(t *testing.T) {
	defer func(n int) { monitorBuffer = n }(monitorBuffer)
	monitorBuffer = 32 << 10
	ns, fd := testNetns(t)
	b, err := NewInNamespace(testConfig(), nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	nc := b.conn.(*netlinkConn)
	// listen subscribes, lets do change the kernel while nothing reads
	// the socket (so that it overflows), then reads what came.
	listen := func(what string, do func()) []proxy.Drift {
		t.Helper()
		mon, err := nc.subscribe()
		if err != nil {
			t.Fatal(err)
		}
		do()
		ctx, cancel := context.WithCancel(context.Background())
		drifts := make(chan proxy.Drift, 16)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = nc.listen(ctx, mon, func(d proxy.Drift) { drifts <- d })
		}()
		time.Sleep(time.Second)
		cancel()
		<-done
		close(drifts)
		var out []proxy.Drift
		for d := range drifts {
			out = append(out, d)
		}
		t.Logf("%s: %d drifts %+v", what, len(out), out)
		return out
	}
	if ds := listen("kp's full sync of 2,000 Services", func() { mustSync(t, b, scaleState(2000, 10)) }); len(ds) > 0 {
		t.Errorf("kp's own full sync reported as drift: %+v", ds)
	}
	ds := listen("kp's sync, then another process's change", func() {
		mustSync(t, b, scaleState(3000, 10))
		nftIn(t, ns, "add", "element", "ip", TableName, setClusterIPs, "{ 10.99.99.99 }")
	})
	if len(ds) == 0 || !ds[0].Unsure {
		t.Errorf("an overflow that hid another process's change: drifts %+v, want an unsure one", ds)
	}
}
