package e2e

import (
	"fmt"
	"net"
	"testing"

	"github.com/kpproxy/kp/test/netns"
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

// A pod's new connections to a ClusterIP that another proxy of the node
// serves as a local address, ahead of the iptables mode's DNAT, reach that
// proxy. That is the node in the middle of a switch from the iptables mode
// to the ipvs mode: both modes' chains share one nat table, the ipvs mode's
// accept (KP-IPVS-SERVICES) runs first, and IPVS answers behind the
// ClusterIP on its dummy interface. A listener on the ClusterIP stands in
// for IPVS here. The iptables mode's filter KP-SERVICES, jumped to from
// INPUT, refused these connections as ones to "other ports" of the
// ClusterIP (KF-2 in docs/known-flakes.md); upstream's iptables mode has no
// INPUT jump to KUBE-SERVICES, nor has kp's now.
func TestPodsConnectionsToAClusterIPAnotherProxyServesLocallyAreNotRefused(t *testing.T) {
	t.Parallel()
	for _, m := range selectedModes(t) {
		if !m.iptables() {
			continue // one nat table with the ipvs mode's: the iptables mode only
		}
		t.Run(m.name, func(t *testing.T) {
			e := newEnv(t, m, 2)
			pods := e.w.Pods()
			e.write("web.yaml", web(pods...))
			e.startKP()
			node, client := e.w.Node(), pods[0].NS
			e.answers(client, "tcp", webTCP)
			ipt := "iptables-" + m.backend
			for _, cmd := range [][]string{
				{"ip", "addr", "add", "10.96.0.10/32", "dev", "lo"},
				{ipt, "-w", "-t", "nat", "-I", "PREROUTING", "1", "-d", "10.96.0.10/32", "-p", "tcp", "--dport", "80",
					"-m", "comment", "--comment", "stand-in for the ipvs mode's accept", "-j", "ACCEPT"},
			} {
				if out, err := e.w.Exec(node, cmd...); err != nil {
					t.Fatalf("%v: %v\n%s", cmd, err, out)
				}
			}
			netns.Serve(t, node, webTCP, func(c net.Conn) { fmt.Fprintf(c, "ipvs-stand-in %s\n", c.RemoteAddr()) })
			answers, failed := e.tally(client, "tcp", webTCP, 20)
			if len(failed) > 0 || answers["ipvs-stand-in"] != 20 {
				t.Fatalf("20 new connections from %s to %s, served by a local listener ahead of kp's DNAT: answers %v, failures %v, want all 20 by the stand-in\n%s",
					client, webTCP, answers, failed, e.rules())
			}
		})
	}
}
