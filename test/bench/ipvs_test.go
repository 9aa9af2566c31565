package bench

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kpproxy/kp/test/netns"
	"github.com/moby/ipvs"
)

// The ipvs modes (kp-ipvs, upstream-ipvs) need a kernel with IPVS: they run
// in the VM (make bench-vm, vm_test.go).

// ipvsDummies are the interfaces the two ipvs modes hold Service addresses
// on: upstream's and kp's.
var ipvsDummies = []string{"kube-ipvs0", "kp-ipvs0"}

// countIPVS counts the benchmark's virtual servers (TCP on servicePort)
// in namespace ns, through IPVS's netlink dump, which is per namespace.
// Not from /proc/net/ip_vs: on 6.1 that listing walks one table shared by
// every namespace, and when it is read in several chunks (a page each) it
// resumes by a position counted over all of them, so with another
// namespace holding services it skips some of this one's: with kp-ipvs's
// world still up beside upstream-ipvs's (both with the same 1,000
// Services), it showed 498 of upstream's 1,000 for 15 minutes.
func countIPVS(ns string) (int, error) {
	svcs, err := ipvsServers(ns)
	return len(benchServers(svcs)), err
}

// ipvsServers lists namespace ns's IPVS virtual servers.
func ipvsServers(ns string) ([]*ipvs.Service, error) {
	var svcs []*ipvs.Service
	err := inIPVS(ns, func(h *ipvs.Handle) (err error) {
		svcs, err = h.GetServices()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list the IPVS virtual servers: %w", err)
	}
	return svcs, nil
}

// ipvsComplete checks that each of the benchmark's virtual servers in
// namespace ns has a real server on podPort. It asks for each server's
// real servers in turn, so the benchmark checks it once a cold start is
// done, not while it polls.
func ipvsComplete(ns string) error {
	return inIPVS(ns, func(h *ipvs.Handle) error {
		svcs, err := h.GetServices()
		if err != nil {
			return fmt.Errorf("list the IPVS virtual servers: %w", err)
		}
		for _, s := range benchServers(svcs) {
			dests, err := h.GetDestinations(s)
			if err != nil {
				return fmt.Errorf("list the real servers of %s:%d: %w", s.Address, s.Port, err)
			}
			if !slices.ContainsFunc(dests, func(d *ipvs.Destination) bool { return d.Port == podPort }) {
				return fmt.Errorf("virtual server %s:%d has no real server on port %d", s.Address, s.Port, podPort)
			}
		}
		return nil
	})
}

// inIPVS runs fn with an IPVS netlink socket in namespace ns.
func inIPVS(ns string, fn func(h *ipvs.Handle) error) error {
	return netns.InNamespace(ns, func() error {
		h, err := ipvs.New("")
		if err != nil {
			return fmt.Errorf("open IPVS in %s: %w", ns, err)
		}
		defer h.Close()
		return fn(h)
	})
}

// benchServers keeps the benchmark's virtual servers: TCP on servicePort
// (the API server's own Service is on 443).
func benchServers(svcs []*ipvs.Service) []*ipvs.Service {
	var out []*ipvs.Service
	for _, s := range svcs {
		if s.Protocol == syscall.IPPROTO_TCP && s.Port == servicePort && s.FWMark == 0 {
			out = append(out, s)
		}
	}
	return out
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
	svcs, err := ipvsServers(ns)
	if err != nil {
		return err
	}
	if len(svcs) > 0 {
		s := svcs[0]
		return fmt.Errorf("an ipvs mode's virtual server %d %s:%d fwmark %d is still there (%d virtual servers in all)",
			s.Protocol, s.Address, s.Port, s.FWMark, len(svcs))
	}
	out, err := netns.Exec(ns, "sh", "-c",
		"ip -br link; ipset list -n; iptables-nft-save; iptables-legacy-save; ip6tables-nft-save")
	if err != nil {
		return fmt.Errorf("list the ipvs state: %w\n%s", err, out)
	}
	return leftoverIn(out)
}

// leftover patterns: an ipvs mode's dummy interface, an ipset of either
// mode (ipset list -n prints names alone), a chain of either mode.
var leftover = regexp.MustCompile(`(?m)\b(kube|kp)-ipvs0\b|^(KUBE|KP)-\S*$|^:(KUBE|KP)-\S+`)

// leftoverIn is ipvsLeftovers's judgement of a listing.
func leftoverIn(listing string) error {
	if m := leftover.FindString(listing); m != "" {
		return fmt.Errorf("an ipvs mode's %q is still there:\n%s", m, tail(listing))
	}
	return nil
}

func TestIPVSBenchServersAreTCPOnTheServicePort(t *testing.T) {
	vs := func(proto uint16, port uint16, fwmark uint32) *ipvs.Service {
		return &ipvs.Service{Protocol: proto, Address: net.ParseIP("10.96.0.10"), Port: port, FWMark: fwmark}
	}
	got := benchServers([]*ipvs.Service{
		vs(syscall.IPPROTO_TCP, servicePort, 0), // a benchmark Service
		vs(syscall.IPPROTO_TCP, 443, 0),         // the API server's
		vs(syscall.IPPROTO_UDP, servicePort, 0), // UDP on the same port
		vs(0, 0, 7),                             // a firewall-mark server
		vs(syscall.IPPROTO_TCP, servicePort, 0),
	})
	if len(got) != 2 {
		t.Errorf("benchServers kept %d, want the 2 TCP servers on port %d", len(got), servicePort)
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
