package e2e

import (
	"testing"
)

// The node's own connections to a ClusterIP that is one of its local
// addresses are answered, in every mode. The kernel gives such a
// connection the ClusterIP itself as its source, so every reply is
// addressed to the ClusterIP. A ClusterIP is local while an ipvs proxy's
// dummy interface holds it: during a switch away from kp's ipvs mode, and
// after it while virtual servers stay for their connections (the
// userspace mode refused those replies as connections to "other ports" of
// the ClusterIP, so its switch from ipvs failed its verify step, in the
// VM: TestMigrateNodeEveryOrderedPairOfModesDropsNothing/ipvs-1).
func TestNodesOwnConnectionsToALocalClusterIPAreAnswered(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		e.write("web.yaml", web(pods...))
		e.startKP()
		node := e.w.Node()
		e.answers(node, "tcp", webTCP)
		if !m.ipvs { // the ipvs mode's own dummy interface holds it already
			if out, err := e.w.Exec(node, "ip", "addr", "add", "10.96.0.10/32", "dev", "lo"); err != nil {
				t.Fatalf("make the ClusterIP local: %v\n%s", err, out)
			}
		}
		names := e.podNames(pods...)
		for _, c := range []struct{ network, addr string }{{"tcp", webTCP}, {"udp", webUDP}} {
			for name, k := range e.spread(t, node, c.network, c.addr, 10) {
				if !contains(names, name) {
					t.Errorf("%s %s from the node: %d answers by %q, not an endpoint", c.network, c.addr, k, name)
				}
			}
		}
	})
}
