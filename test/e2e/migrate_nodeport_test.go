package e2e

import (
	"regexp"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// kp started in nftables or iptables mode and switched to userspace with
// kp migrate node serves a NodePort Service to a client off the node, on
// TCP and UDP, as a kp started in userspace does: the switched backend is
// built from the same node facts. Without a Node object (a folder of
// manifests without one, or a Node not known yet) the node's addresses
// come from the kernel: nftables mode answers NodePorts on the addresses
// of the default route's interface, iptables mode with
// --nodeport-addresses primary on every local address.
func TestMigrateNodeToUserspaceServesNodePortsFromOffNode(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save")
	t.Parallel()
	for _, c := range []struct {
		name   string
		from   mode
		args   []string
		noNode bool
	}{
		{name: "nftables", from: modeNFTables},
		{name: "nftables-without-a-node-object", from: modeNFTables, noNode: true},
		{name: "iptables-nft-primary-without-a-node-object", from: modeIPTablesNFT, noNode: true,
			args: []string{"--nodeport-addresses", "primary"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			from := c.from
			from.args = append(slices.Clone(from.args), c.args...)
			e := newEnv(t, from, 3)
			pods := e.w.Pods()
			svc := web(pods...)
			svc.Type = v1.ServiceTypeNodePort
			svc.Ports[0].NodePort = 30080
			svc.Ports[1].NodePort = 30053
			e.write("web.yaml", svc)
			if c.noNode {
				if err := e.dir.Remove("node.yaml"); err != nil {
					t.Fatal(err)
				}
			}
			e.startKP()
			client := e.w.Client()
			names := e.podNames(pods...)
			nodeTCP := hostPort(e.w.NodeIP().String(), 30080)
			nodeUDP := hostPort(e.w.NodeIP().String(), 30053)
			e.answers(client, "tcp", nodeTCP, names...)
			e.answers(client, "udp", nodeUDP, names...)

			out, err := e.tryMigrate("--to", "userspace")
			if err != nil {
				// A switch its verify step refuses leaves the old mode
				// serving: say whether it does.
				counts, failed := e.tally(client, "tcp", nodeTCP, 20)
				t.Fatalf("kp migrate node --to userspace: %v\n%s\nafter it, %s from off the node: answers %v, failed %v",
					err, out, nodeTCP, counts, counted(failed))
			}
			t.Logf("kp migrate node --to userspace:\n%s", out)
			if !regexp.MustCompile(`verify +2 service ports proven by userspace's counters \(\d+ probes: 2 ClusterIP, [1-9]\d* NodePort`).MatchString(out) {
				t.Errorf("the verify step did not prove the NodePorts:\n%s", out)
			}
			e.expectOnly("userspace")
			for _, a := range []struct{ network, addr string }{{"tcp", nodeTCP}, {"udp", nodeUDP}, {"tcp", webTCP}} {
				counts, failed := e.tally(client, a.network, a.addr, 20)
				if len(failed) > 0 {
					rules, _ := e.w.NFT("list", "table", "ip", "kp-userspace")
					t.Fatalf("after the switch to userspace, %s %s from off the node: %d of 20 failed (%v); answers %v\nkp-userspace:\n%s",
						a.network, a.addr, 20-total(counts), counted(failed), counts, rules)
				}
				for name := range counts {
					if !contains(names, name) {
						t.Errorf("%s %s answered by %q, not one of %v", a.network, a.addr, name, names)
					}
				}
			}
		})
	}
}
