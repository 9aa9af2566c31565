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

// onlyWithIPVSInTheVM sorts a migration between the host and the VM:
// one from or to an ipvs mode runs where IPVS is (the VM's kernel), the
// others on the host only (TestIPVSMigrationsInTheVM runs the migration
// tests with the nftables mode selected too).
func onlyWithIPVSInTheVM(t *testing.T, ipvs bool) {
	t.Helper()
	if ipvs {
		requireIPVS(t)
	} else if os.Getenv("KP_VM") == "1" {
		t.Skip("proven on the host")
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

// noIPVSState reports nil when the node holds nothing of an ipvs mode,
// kp's or kube-proxy's: no virtual server, no kp-ipvs0 or kube-ipvs0, no
// KP- or KUBE- ipset, no KP-IPVS- chain. (Every virtual server in a test's
// node is kp's or kube-proxy's.) On a kernel without IPVS there is nothing
// to look at.
func noIPVSState(w *netns.World) error {
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		return nil
	}
	out, err := w.Exec(w.Node(), "sh", "-c", "ipvsadm -Ln; ip -br link; ipset list -n; iptables-nft-save; iptables-legacy-save; ip6tables-nft-save")
	if err != nil {
		return fmt.Errorf("list the ipvs state: %v\n%s", err, out)
	}
	for _, re := range []string{`(?m)^(TCP|UDP|SCTP) `, `kp-ipvs0`, `kube-ipvs0`, `(?m)^KP-`, `(?m)^KUBE-`, `KP-IPVS-`} {
		if m := regexp.MustCompile(re).FindString(out); m != "" {
			return fmt.Errorf("the ipvs mode's %q is still there:\n%s", m, out)
		}
	}
	return nil
}

// ipvsKeptOnly checks what a switch away from an ipvs mode leaves while
// connections last: the virtual server TCP tcpAddr, which the long-lived
// connection uses, is kept (other TCP ones may be, for connections of the
// loop still open at the switch); UDP udpAddr, which the UDP flow uses, is
// kept while IPVS tracks a connection of it (IPVS, not conntrack, carries
// such a flow: deleting its virtual server under it drops a packet). A
// flow IPVS no longer tracks has left it: its conntrack entry was replaced
// and its packets take the new mode's NAT (seen in CI, 2026-11-25: the
// flow DNATed by kp's nftables rules, no IPVS entry for it, no request
// lost), so its server may go; the traffic loop checks that no request was
// lost either way. No other UDP server, and no KP-IPVS- or KUBE- chain.
func (e *env) ipvsKeptOnly(tcpAddr, udpAddr string) {
	e.t.Helper()
	// The connections first: a server kp removes for want of connections
	// is then already gone from the listing after them.
	out, err := e.w.Exec(e.w.Node(), "sh", "-c", "ipvsadm -Lnc; echo ----; ipvsadm -Ln; iptables-nft-save")
	if err != nil {
		e.t.Fatalf("list the ipvs state: %v\n%s", err, out)
	}
	conns, out, _ := strings.Cut(out, "----\n")
	udpTracked := false
	for _, l := range strings.Split(conns, "\n") {
		// pro expire state source virtual destination
		if f := strings.Fields(l); len(f) == 6 && f[0] == "UDP" && f[4] == udpAddr {
			udpTracked = true
		}
	}
	keptTCP, keptUDP := false, false
	for _, m := range regexp.MustCompile(`(?m)^(TCP|UDP|SCTP) +(\S+)`).FindAllStringSubmatch(out, -1) {
		keptTCP = keptTCP || m[1] == "TCP" && m[2] == tcpAddr
		keptUDP = keptUDP || m[1] == "UDP" && m[2] == udpAddr
		if m[1] != "TCP" && !(m[1] == "UDP" && m[2] == udpAddr) {
			e.t.Errorf("after the switch from ipvs the virtual server %s %s is left", m[1], m[2])
		}
	}
	if !keptTCP || udpTracked && !keptUDP || strings.Contains(out, "KP-IPVS-") || regexp.MustCompile(`(?m)^:KUBE-`).MatchString(out) {
		// What IPVS and conntrack track, and kp's Retire runs (what each
		// kept), say which connection left IPVS and when.
		tracked, _ := e.w.Exec(e.w.Node(), "sh", "-c", "conntrack -L 2>/dev/null")
		var retires []string
		for _, l := range strings.Split(e.kp.Log(), "\n") {
			if strings.Contains(l, "ipvs") || strings.Contains(l, "kept") || strings.Contains(l, "virtual server") {
				retires = append(retires, l)
			}
		}
		e.t.Errorf("after the switch from ipvs, want the virtual servers TCP %s (its connection is established) and, while IPVS tracks its flow (%v), UDP %s, and no KP-IPVS- or KUBE- chain:\n%s\nIPVS connections:\n%s\nconntrack:\n%s\nkp's log on IPVS:\n%s",
			tcpAddr, udpTracked, udpAddr, out, conns, tracked, strings.Join(retires, "\n"))
	}
	if !udpTracked {
		e.t.Logf("the UDP flow left IPVS before the listing (its server kept: %v)", keptUDP)
	}
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
