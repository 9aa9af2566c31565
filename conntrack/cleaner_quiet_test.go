package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
)

// On a node whose table always holds UDP (DNS), a sync that changed only
// TCP Services' endpoints neither dumps the table nor judges it; a sync that
// changed a UDP Service does, and so does every sync after which the last
// run cannot vouch for the table: a failed run, a State the cleaner did not
// see (a failed sync), new node addresses, a mode switch.
func TestCleanerJudgesOnlyWhenAChangeCanHaveMadeAnEntryStale(t *testing.T) {
	w := statetest.New()
	dns := statetest.PortName("kube-system", "dns", "dns", "UDP")
	web := statetest.PortName("ns", "web", "http", "TCP")
	w.AddService(dns, "10.96.0.10", 53, 0, "10.244.1.2:5353", "10.244.1.3:5353")
	w.AddService(web, "10.96.0.80", 80, 0, "10.244.2.2:8080")
	conn := &fakeConn{flows: []Flow{flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.2:5353")}}
	dumps := 0
	c := NewCleaner(CleanerConfig{
		Dial:       func() (Conn, error) { dumps++; return conn, nil },
		LocalAddrs: func() ([]netip.Addr, error) { return proxytest.Addrs("10.0.2.1"), nil },
	})
	var prev *proxy.State
	step := func(what string, wantDump bool) {
		t.Helper()
		cur := w.Next()
		before := dumps
		if _, err := c.Clean(context.Background(), prev, cur); err != nil && conn.dumpErr == nil {
			t.Fatalf("%s: %v", what, err)
		}
		if dumped := dumps > before; dumped != wantDump {
			t.Errorf("%s: dumped the table %t, want %t", what, dumped, wantDump)
		}
		prev = cur
	}
	step("the first sync", true)
	w.SetEndpoints(web, "10.244.2.3:8080")
	step("a TCP Service's endpoints replaced", false)
	step("nothing changed", false)

	w.SetEndpoints(dns, "10.244.1.3:5353")
	step("the UDP Service lost an endpoint", true)
	if len(conn.deleted) != 1 || conn.deleted[0].Orig.Src.Port() != 40000 {
		t.Errorf("deleted %v, want the flow to the endpoint gone", conn.deleted)
	}

	conn.dumpErr = errors.New("netlink: no buffer space")
	w.SetEndpoints(dns, "10.244.1.4:5353")
	step("a run that fails", true)
	conn.dumpErr = nil
	w.SetEndpoints(web, "10.244.2.4:8080")
	step("a TCP change after a failed run", true)

	w.SetEndpoints(web, "10.244.2.5:8080")
	w.Next() // a sync that failed: the cleaner never sees it
	w.SetEndpoints(web, "10.244.2.6:8080")
	step("a TCP change after a State not seen", true)

	w.NodeChanged = true
	step("new node addresses", true)

	c.SetKeepRedirected(true)
	step("nothing changed, after a mode switch", true)
	step("nothing changed, after that", false)
}
