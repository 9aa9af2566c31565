package bench

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/netns"
)

// The ipvs modes (kp-ipvs, upstream-ipvs) need a kernel with IPVS: they run
// in the VM (make bench-vm, vm_test.go).

// ipvsDummies are the interfaces the two ipvs modes hold Service addresses
// on: upstream's and kp's.
var ipvsDummies = []string{"kube-ipvs0", "kp-ipvs0"}

// countIPVS counts the benchmark's Services among the IPVS virtual servers
// of namespace ns, from /proc/net/ip_vs (the kernel's own listing, per
// network namespace: cheaper than ipvsadm's netlink dump, which asks for
// each virtual server's real servers in turn).
func countIPVS(ns string) (int, error) {
	out, err := netns.Exec(ns, "cat", "/proc/net/ip_vs")
	if err != nil {
		return 0, fmt.Errorf("read /proc/net/ip_vs: %w: %s", err, out)
	}
	return ipvsServices(out), nil
}

// ipvsServices counts, in a /proc/net/ip_vs listing, the TCP virtual
// servers on servicePort with at least one real server on podPort: the
// benchmark's Services (the API server's own Service is on 443, its
// endpoint on 6443). The kernel prints IPv4 addresses and ports in hex:
//
//	TCP  0A60000A:0050 rr
//	  -> AC100000:1F90      Masq    1      0          0
func ipvsServices(listing string) int {
	n := 0
	inService, counted := false, false
	for _, line := range strings.Split(listing, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP" || f[0] == "FWM"):
			inService = f[0] == "TCP" && hexPort(f[1]) == servicePort
			counted = false
		case len(f) >= 2 && f[0] == "->":
			if inService && !counted && hexPort(f[1]) == podPort {
				n++
				counted = true
			}
		}
	}
	return n
}

// hexPort is the port of "ADDR:PORT" with PORT in hex, -1 if none.
func hexPort(addrPort string) int {
	i := strings.LastIndexByte(addrPort, ':')
	if i < 0 {
		return -1
	}
	v, err := strconv.ParseUint(addrPort[i+1:], 16, 16)
	if err != nil {
		return -1
	}
	return int(v)
}

// flushIPVS removes what an ipvs mode leaves in namespace ns once its
// iptables rules are gone (stop flushes those first: an ipset a rule
// still names cannot be destroyed): every virtual server, the dummy
// interfaces and every ipset. On a kernel without IPVS there is nothing.
func flushIPVS(ns string) error {
	if !hasIPVS(ns) {
		return nil
	}
	if out, err := netns.Exec(ns, "ipvsadm", "-C"); err != nil {
		return fmt.Errorf("ipvsadm -C: %w: %s", err, out)
	}
	for _, dev := range ipvsDummies {
		if out, err := netns.Exec(ns, "ip", "link", "show", dev); err != nil {
			if strings.Contains(out, "does not exist") {
				continue
			}
			return fmt.Errorf("ip link show %s: %w: %s", dev, err, out)
		}
		if out, err := netns.Exec(ns, "ip", "link", "del", dev); err != nil {
			return fmt.Errorf("ip link del %s: %w: %s", dev, err, out)
		}
	}
	if out, err := netns.Exec(ns, "ipset", "destroy"); err != nil {
		return fmt.Errorf("ipset destroy: %w: %s", err, out)
	}
	return nil
}

// hasIPVS says whether the kernel has IPVS (its /proc/net/ip_vs).
func hasIPVS(ns string) bool {
	_, err := netns.Exec(ns, "test", "-e", "/proc/net/ip_vs")
	return err == nil
}

// ipvsLeftovers is nil when namespace ns holds nothing of an ipvs mode:
// no virtual server, no dummy interface of theirs, no ipset, no KUBE- or
// KP- chain in either iptables backend.
func ipvsLeftovers(ns string) error {
	if !hasIPVS(ns) {
		return nil
	}
	out, err := netns.Exec(ns, "sh", "-c",
		"cat /proc/net/ip_vs; ip -br link; ipset list -n; iptables-nft-save; iptables-legacy-save; ip6tables-nft-save")
	if err != nil {
		return fmt.Errorf("list the ipvs state: %w\n%s", err, out)
	}
	return leftoverIn(out)
}

// leftover patterns: a virtual server line of /proc/net/ip_vs, an ipvs
// mode's dummy interface, an ipset of either mode (ipset list -n prints
// names alone), a chain of either mode.
var leftover = regexp.MustCompile(`(?m)^(TCP|UDP|SCTP|FWM) +\S+|\b(kube|kp)-ipvs0\b|^(KUBE|KP)-\S*$|^:(KUBE|KP)-\S+`)

// leftoverIn is ipvsLeftovers's judgement of a listing.
func leftoverIn(listing string) error {
	if m := leftover.FindString(listing); m != "" {
		return fmt.Errorf("an ipvs mode's %q is still there:\n%s", m, tail(listing))
	}
	return nil
}

func TestIPVSCountsVirtualServersWithABenchmarkRealServer(t *testing.T) {
	const header = "IP Virtual Server version 1.2.1 (size=4096)\n" +
		"Prot LocalAddress:Port Scheduler Flags\n" +
		"  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n"
	for _, c := range []struct {
		name, listing string
		want          int
	}{
		{"empty", header, 0},
		{"two Services with benchmark endpoints", header +
			"TCP  0A60000A:0050 rr\n  -> AC100000:1F90      Masq    1      0          0\n  -> AC100001:1F90      Masq    1      0          0\n" +
			"TCP  0A60000B:0050 rr\n  -> AC10000A:1F90      Masq    1      0          0\n", 2},
		{"the API server's Service (443 to 6443) is not the benchmark's", header +
			"TCP  0A600001:01BB rr\n  -> C0A80001:192B      Masq    1      0          0\n", 0},
		{"a Service with no real server yet", header + "TCP  0A60000A:0050 rr\n", 0},
		{"a UDP virtual server on port 80 is not a benchmark Service", header +
			"UDP  0A60000A:0050 rr\n  -> AC100000:1F90      Masq    1      0          0\n", 0},
		{"real servers on another port", header +
			"TCP  0A60000A:0050 rr\n  -> AC100000:0050      Masq    1      0          0\n", 0},
	} {
		if got := ipvsServices(c.listing); got != c.want {
			t.Errorf("%s: %d Services, want %d", c.name, got, c.want)
		}
	}
}

func TestIPVSLeftoversNameWhatIsLeft(t *testing.T) {
	const clean = "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n" +
		"  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n" +
		"lo               UNKNOWN        127.0.0.1/8\neth0@if12        UP             10.0.0.2/24\n" +
		"# Generated by iptables-legacy-save v1.8.9\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"
	for _, c := range []struct {
		name, listing, want string
	}{
		{"nothing left", clean, ""},
		{"a virtual server", clean + "TCP  0A60000A:0050 rr\n", "TCP  0A60000A:0050"},
		{"upstream's dummy interface", clean + "kube-ipvs0       DOWN           10.96.0.10/32\n", "kube-ipvs0"},
		{"kp's dummy interface", clean + "kp-ipvs0         DOWN\n", "kp-ipvs0"},
		{"an ipset", clean + "KUBE-CLUSTER-IP\n", "KUBE-CLUSTER-IP"},
		{"a chain", clean + "*nat\n:KP-IPVS-POSTROUTING - [0:0]\nCOMMIT\n", ":KP-IPVS-POSTROUTING"},
	} {
		err := leftoverIn(c.listing)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
}
