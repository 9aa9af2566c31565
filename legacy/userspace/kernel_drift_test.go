package userspace

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// TestKernelDriftCheckFindsAnotherProcessesChangeToTheRedirects: in each
// redirect method, the check finds nothing after kp's sync, nor after
// another program's change elsewhere; a deleted redirect (the map element,
// or the flushed KP-USERSPACE-PORTALS chain) is found, once, and the sync
// after it writes the redirects again: the Service answers.
func TestKernelDriftCheckFindsAnotherProcessesChangeToTheRedirects(t *testing.T) {
	forEachRedirect(t, func(t *testing.T, red redirectMethod) {
		k := newKernelWorldWith(t, 1, red, proxy.Config{})
		p := k.w.Pods()[0]
		k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 0, p.IP.String()+":8080")
		k.sync()
		if _, err := k.ask(k.w.Client(), "tcp", "10.96.0.10:80"); err != nil {
			t.Fatalf("before: %v", err)
		}
		check := func() *proxy.Drift {
			t.Helper()
			d, err := k.b.checkDrift(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		run := func(cmd ...string) {
			t.Helper()
			if out, err := k.w.Exec(k.w.Node(), cmd...); err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
			}
		}
		if d := check(); d != nil {
			t.Fatalf("right after kp's sync: %+v", d)
		}
		tamper := []string{"nft", "delete", "element", "ip", TableName, mapRedirects, "{ 10.96.0.10 . tcp . 80 }"}
		other := []string{"nft", "add", "table", "ip", "another-program"}
		if red.iptablesBackend != "" {
			bin := "iptables-" + red.iptablesBackend
			tamper = []string{bin, "-t", "nat", "-F", chainPortals}
			other = []string{bin, "-t", "nat", "-N", "ANOTHER-PROGRAM"}
		}
		run(other...)
		if d := check(); d != nil {
			t.Fatalf("after another program's change: %+v", d)
		}
		run(tamper...)
		d := check()
		if d == nil {
			t.Fatalf("after %s: no drift found", strings.Join(tamper, " "))
		}
		t.Logf("drift: %s", d.What)
		if d := check(); d != nil {
			t.Errorf("found again before the repair: %+v", d)
		}
		k.sync()
		if _, err := k.ask(k.w.Client(), "tcp", "10.96.0.10:80"); err != nil {
			t.Errorf("after the repair: %v", err)
		}
		if d := check(); d != nil {
			t.Errorf("after the repair: %+v", d)
		}
	})
}
