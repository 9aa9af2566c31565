package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// kp started on a node that upstream kube-proxy programmed (its iptables
// rules, as migrate/testdata has them beside kubelet's, a CNI's and an
// operator's, in the iptables-nft backend, and its nftables table) serves
// the Services and, after its first sync, leaves none of kube-proxy's rules
// and all of the others'.
func TestKPTakesTheNodeOverFromKubeProxysLeftovers(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		netns.Require(t, "iptables-nft-restore", "iptables-nft-save", "nft")
		e := newEnv(t, m, 2)
		node := e.w.Node()
		for _, f := range []string{"kube-proxy-iptables-nat.rules", "kube-proxy-iptables-filter.rules"} {
			path, err := filepath.Abs(filepath.Join("..", "..", "migrate", "testdata", f))
			if err != nil {
				t.Fatal(err)
			}
			if out, err := e.w.Exec(node, "sh", "-c", "iptables-nft-restore --noflush < "+path); err != nil {
				t.Fatalf("load %s: %v\n%s", f, err, out)
			}
		}
		script := filepath.Join(t.TempDir(), "kube-proxy.nft")
		if err := os.WriteFile(script, []byte("table ip kube-proxy {\n\tchain services {\n\t}\n}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := e.w.NFT("-f", script); err != nil {
			t.Fatalf("nft -f: %v\n%s", err, out)
		}

		e.write("web.yaml", web(e.w.Pods()...))
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP)
		e.eventually("kube-proxy's rules removed", 15*time.Second, func() error {
			save, err := e.w.Exec(node, "iptables-nft-save")
			if err != nil {
				return err
			}
			for _, gone := range []string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "KUBE-POSTROUTING", "-j KUBE-SERVICES"} {
				if strings.Contains(save, gone) {
					return fmt.Errorf("iptables-nft-save still has %q:\n%s", gone, save)
				}
			}
			for _, kept := range []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "-j OPERATOR", "-j CNI-MASQ", ":KUBE-MARK-MASQ"} {
				if !strings.Contains(save, kept) {
					return fmt.Errorf("iptables-nft-save lost %q:\n%s", kept, save)
				}
			}
			if tables, err := e.w.NFT("list", "tables"); err != nil || strings.Contains(tables, "kube-proxy") {
				return fmt.Errorf("nft tables (%v):\n%s", err, tables)
			}
			return nil
		})
		e.answers(e.w.Client(), "tcp", webTCP)
	})
}
