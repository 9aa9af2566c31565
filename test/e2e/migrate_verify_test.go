package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// kp migrate node's verify step proves, for a switch into every mode,
// every kind of address the node serves (ClusterIP, NodePort on each
// NodePort address, externalIP, LoadBalancer IP; TCP and UDP) by the new
// mode's own counters. kp starts in nftables mode with the target mode's
// flags (userspace mode for the nftables target), so the switch builds
// the target as a kp started in it with those flags.
// Its probes start on the node: a nat chain of another table in the node,
// ahead of kp's, counts them in the OUTPUT hook and never in PREROUTING,
// which only the off-node client's connection passes. That is the
// measurement behind migrate.VerifyServices' comment: the probes prove
// what the OUTPUT hook reaches, and every mode reaches the same per-Service
// state from both hooks.
func TestMigrateVerifyProvesEveryKindOfAddressInEveryMode(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		from := m
		from.args = append(slices.Clone(m.args), "--proxy-mode", "nftables")
		if m.name == modeNFTables.name {
			from.args = slices.Clone(modeUserspace.args)
		}
		e := newEnv(t, from, 2)
		pods := e.w.Pods()
		svc := web(pods...)
		svc.Type = v1.ServiceTypeLoadBalancer
		svc.Ports[0].NodePort, svc.Ports[1].NodePort = 30080, 30053
		svc.ExternalIPs = []string{"10.96.100.1"}
		svc.LoadBalancerIPs = []string{"10.96.200.1"}
		e.write("web.yaml", svc)
		e.startKP()
		client := e.w.Client()
		nodeTCP := hostPort(e.w.NodeIP().String(), 30080)
		e.answers(client, "tcp", nodeTCP)

		measure := !m.ipvs // IPVS takes connections without nat chains
		if measure {
			e.nftScript(fmt.Sprintf(`table ip kp-e2e-measure {
	chain pre { type nat hook prerouting priority -150; ip daddr %[1]s tcp dport 30080 counter; }
	chain out { type nat hook output priority -150; ip daddr %[1]s tcp dport 30080 counter; }
}`, e.w.NodeIP()))
		}
		target := m.proxyMode
		if m.iptables() {
			target += "-" + m.backend
		}
		out := e.migrate("--to", target)
		t.Logf("kp migrate node --to %s:\n%s", target, out)
		verify := regexp.MustCompile(`verify +2 service ports proven by .*'s counters \((\d+) probes: 2 ClusterIP, (\d+) NodePort, 2 externalIP, 2 LoadBalancer IP; 0 skipped\)`).
			FindStringSubmatch(out)
		if verify == nil {
			t.Fatalf("the verify step did not prove the ClusterIP, the NodePorts, the externalIP and the LoadBalancer IP:\n%s", out)
		}
		// TCP and UDP, on at least the node's IP.
		if n, _ := strconv.Atoi(verify[2]); n < 2 || n%2 != 0 {
			t.Errorf("%s NodePort probes, want a TCP and a UDP one per NodePort address", verify[2])
		}
		if !measure {
			return
		}
		pre, outp := e.measured("pre"), e.measured("out")
		t.Logf("the node's probes to %s: nat OUTPUT %d packets, nat PREROUTING %d", nodeTCP, outp, pre)
		if outp == 0 || pre != 0 {
			t.Errorf("the verify probes to %s passed nat OUTPUT %d times and nat PREROUTING %d times; want OUTPUT only", nodeTCP, outp, pre)
		}
		e.answers(client, "tcp", nodeTCP)
		if pre := e.measured("pre"); pre == 0 {
			t.Errorf("the off-node client's connection to %s did not pass nat PREROUTING: the measurement counts nothing", nodeTCP)
		}
	})
}

// nftScript loads an nft script into the node namespace.
func (e *env) nftScript(script string) {
	e.t.Helper()
	path := filepath.Join(e.t.TempDir(), "script.nft")
	if err := os.WriteFile(path, []byte(script+"\n"), 0o644); err != nil {
		e.t.Fatal(err)
	}
	if out, err := e.w.NFT("-f", path); err != nil {
		e.t.Fatalf("nft -f: %v\n%s", err, out)
	}
}

// measured reads the packets of chain's counter in table ip
// kp-e2e-measure, failing the test if it cannot.
func (e *env) measured(chain string) int {
	e.t.Helper()
	n, err := e.readCounter(chain)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// readCounter is measured for any goroutine.
func (e *env) readCounter(chain string) (int, error) {
	out, err := e.w.NFT("list", "chain", "ip", "kp-e2e-measure", chain)
	if err != nil {
		return 0, fmt.Errorf("nft list chain %s: %w\n%s", chain, err, out)
	}
	m := regexp.MustCompile(`counter packets (\d+)`).FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no counter in chain %s:\n%s", chain, out)
	}
	return strconv.Atoi(m[1])
}
