package e2e

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/test/netns"
)

// TestExplainNamesTheEndpointAnAffinityEntryPinsTheClientTo: after a
// connection to a Service with ClientIP affinity, kp explain --from the
// client names, live and from a snapshot, the endpoint that answered as
// the one the client is pinned to (read from the mode's affinity state:
// an nftables set, the recent module's lists, IPVS templates, the
// userspace balancer), with probability 1 for it; another client is not
// pinned.
func TestExplainNamesTheEndpointAnAffinityEntryPinsTheClientTo(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		svc := web(pods...)
		svc.AffinitySeconds = 3600
		e.write("web.yaml", svc)
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP)
		name, err := e.ask(e.w.Client(), "tcp", webTCP)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(pods, func(p *netns.Pod) bool { return p.Name == name })
		if i < 0 {
			t.Fatalf("answered by %q, no pod of the Service", name)
		}
		answered := hostPort(pods[i].IP.String(), 8080)
		client := e.w.ClientIP().String()

		snapFile := filepath.Join(t.TempDir(), "node.kpsnap.json")
		if _, stderr, code := e.runKP("snapshot", "-o", snapFile, "--status-socket", e.socket); code != 0 {
			t.Fatalf("kp snapshot: exit %d\n%s", code, stderr)
		}
		for _, c := range []struct {
			from string
			x    *explain.Explanation
		}{{"live", e.explainJSON("", client, webTCP)}, {"snapshot", e.explainJSON(snapFile, client, webTCP)}} {
			a := c.x.Affinity
			if a == nil || a.PinnedTo != answered || a.PinnedSecondsLeft <= 0 || a.PinnedSecondsLeft > 3600 {
				t.Errorf("%s: affinity %+v, want the client pinned to %s (%s, which answered) for at most an hour", c.from, a, answered, name)
				continue
			}
			for _, x := range c.x.Endpoints {
				if pinned := x.Address == answered; x.Pinned != pinned || pinned && x.Probability != 1 {
					t.Errorf("%s: endpoint %s pinned %t probability %v; want only %s pinned, with probability 1", c.from, x.Address, x.Pinned,
						x.Probability, answered)
				}
			}
		}
		// The node has made no connection: no entry pins it.
		if a := e.explainJSON("", e.w.NodeIP().String(), webTCP).Affinity; a == nil || a.PinnedTo != "" {
			t.Errorf("the node, which made no connection: affinity %+v, want no pin", a)
		}
	})
}
