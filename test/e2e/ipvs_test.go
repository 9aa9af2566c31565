package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/netns"
)

// requireIPVS skips a test of the ipvs mode on a kernel without IPVS (the
// host's): TestIPVSModeInTheVM runs the suite's ipvs column on the VM's.
func requireIPVS(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		t.Skip("ipvs mode: this kernel has no IPVS (no /proc/net/ip_vs); TestIPVSModeInTheVM runs it in the VM")
	}
}

// ipvsListing is the ipvs mode's state in the node: the virtual servers
// and their real servers (ipvsadm -Ln), kp's ipsets, and the lines of both
// families' iptables-nft-save that name a KP- chain.
func ipvsListing(w *netns.World) (string, error) {
	var b strings.Builder
	out, err := w.Exec(w.Node(), "ipvsadm", "-Ln")
	if err != nil {
		return "", fmt.Errorf("ipvsadm -Ln: %v\n%s", err, out)
	}
	b.WriteString(out)
	out, err = w.Exec(w.Node(), "ipset", "save")
	if err != nil {
		return "", fmt.Errorf("ipset save: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], "KP-") {
			b.WriteString(line + "\n")
		}
	}
	for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		out, err := w.Exec(w.Node(), save)
		if err != nil {
			return "", fmt.Errorf("%s: %v\n%s", save, err, out)
		}
		b.WriteString(kpChainLines(out))
	}
	return b.String(), nil
}

// noIPVSState reports nil when the node holds nothing of the ipvs mode:
// no virtual server, no kp-ipvs0, no KP- ipset, no KP-IPVS- chain. (Every
// virtual server in a test's node is kp's.) On a kernel without IPVS there
// is nothing to look at.
func noIPVSState(w *netns.World) error {
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		return nil
	}
	out, err := w.Exec(w.Node(), "sh", "-c", "ipvsadm -Ln; ip -br link; ipset list -n; iptables-nft-save; iptables-legacy-save; ip6tables-nft-save")
	if err != nil {
		return fmt.Errorf("list the ipvs state: %v\n%s", err, out)
	}
	for _, re := range []string{`(?m)^(TCP|UDP|SCTP) `, `kp-ipvs0`, `(?m)^KP-`, `KP-IPVS-`} {
		if m := regexp.MustCompile(re).FindString(out); m != "" {
			return fmt.Errorf("the ipvs mode's %q is still there:\n%s", m, out)
		}
	}
	return nil
}

// ipvsRemembers reports whether IPVS holds a persistence template for
// clientIP: a connection entry of state NONE from the client, which IPVS
// drops when the Service's affinity timeout passes.
func ipvsRemembers(w *netns.World, clientIP string) bool {
	out, _ := w.Exec(w.Node(), "ipvsadm", "-Lnc")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, " NONE ") && strings.Contains(line, " "+clientIP+":") {
			return true
		}
	}
	return false
}
