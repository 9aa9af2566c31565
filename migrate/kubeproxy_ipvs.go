package migrate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"

	kpipvs "github.com/kpproxy/kp/legacy/ipvs"
	"github.com/kpproxy/kp/proxy"
)

// kubeIPVSInterface is the dummy interface upstream kube-proxy's ipvs mode
// binds every Service address to.
const kubeIPVSInterface = "kube-ipvs0"

// kubeProxyIPSets are the ipsets upstream kube-proxy's ipvs mode creates
// (v1.36); its IPv6 sets carry the same names after "KUBE-6-", cut to
// ipset's 31 characters (KUBE-6-NODE-PORT-LOCAL-SCTP-HAS).
var kubeProxyIPSets = map[string]bool{
	"KUBE-LOOP-BACK": true, "KUBE-CLUSTER-IP": true, "KUBE-EXTERNAL-IP": true, "KUBE-EXTERNAL-IP-LOCAL": true,
	"KUBE-LOAD-BALANCER": true, "KUBE-LOAD-BALANCER-LOCAL": true, "KUBE-LOAD-BALANCER-FW": true,
	"KUBE-LOAD-BALANCER-SOURCE-IP": true, "KUBE-LOAD-BALANCER-SOURCE-CIDR": true,
	"KUBE-NODE-PORT-TCP": true, "KUBE-NODE-PORT-LOCAL-TCP": true, "KUBE-NODE-PORT-UDP": true,
	"KUBE-NODE-PORT-LOCAL-UDP": true, "KUBE-NODE-PORT-SCTP-HASH": true, "KUBE-NODE-PORT-LOCAL-SCTP-HASH": true,
	"KUBE-HEALTH-CHECK-NODE-PORT": true, "KUBE-IPVS-IPS": true,
}

func isKubeProxyIPSet(name string) bool {
	if kubeProxyIPSets[name] {
		return true
	}
	if !strings.HasPrefix(name, "KUBE-6-") {
		return false
	}
	for s := range kubeProxyIPSets {
		v6 := "KUBE-6-" + strings.TrimPrefix(s, "KUBE-")
		if len(v6) > ipsetMaxName {
			v6 = v6[:ipsetMaxName]
		}
		if v6 == name {
			return true
		}
	}
	return false
}

// ipsetMaxName is the longest name an ipset may have.
const ipsetMaxName = 31

// NodePort is a Service's NodePort, which kube-proxy's ipvs mode serves
// with a virtual server on each node address.
type NodePort struct {
	Protocol uint16 // syscall.IPPROTO_TCP, _UDP, _SCTP
	Port     uint16
}

// Removal is what KubeProxyIPVS removes of what it finds.
type Removal int

const (
	// FindOnly removes nothing.
	FindOnly Removal = iota
	// RemoveAll removes everything.
	RemoveAll
	// RemoveIdle keeps the virtual servers still in use (kpipvs.InUse:
	// established connections, UDP flows IPVS tracks), their addresses on
	// kube-ipvs0 and the ipsets, for a later call: IPVS takes a
	// connection's packets in the INPUT hook, so only while its Service
	// address is local, and drops those of a real server it no longer has.
	RemoveIdle
)

// IPVSFound is what kube-proxy's ipvs mode left.
type IPVSFound struct {
	Interface      bool // kube-ipvs0
	VirtualServers int
	// Kept counts the virtual servers RemoveIdle left for their
	// connections.
	Kept   int
	IPSets []string
	// Skipped says why IPVS was not looked at (no IPVS in this kernel).
	Skipped string
}

func (f IPVSFound) String() string {
	if f.Skipped != "" {
		return "ipvs: skipped (" + f.Skipped + ")"
	}
	s := fmt.Sprintf("ipvs: interface %s %v, %d virtual servers, ipsets %v", kubeIPVSInterface, f.Interface, f.VirtualServers, f.IPSets)
	if f.Kept > 0 {
		s += fmt.Sprintf(" (%d virtual servers kept while their connections last)", f.Kept)
	}
	return s
}

func (f IPVSFound) empty() bool { return !f.Interface && f.VirtualServers == 0 && len(f.IPSets) == 0 }

// KubeProxyIPVS finds what upstream kube-proxy's ipvs mode left in the
// calling thread's network namespace and removes it as how says:
// the virtual servers it owned (those on an address of kube-ipvs0, and
// those on another local address whose port is one of nodePorts), then
// kube-ipvs0, then its ipsets (run it after KubeProxyIPTables: an ipset an
// iptables rule still references cannot be destroyed). Another program's
// virtual servers and ipsets stay; upstream's own cleanup flushes them all.
func KubeProxyIPVS(ctx context.Context, how Removal, nodePorts []NodePort) (IPVSFound, error) {
	remove := how != FindOnly
	var found IPVSFound
	var errs []error
	link, err := netlink.LinkByName(kubeIPVSInterface)
	if err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		errs = append(errs, fmt.Errorf("look up %s: %w", kubeIPVSInterface, err))
	}
	bound := map[netip.Addr]bool{}
	var linkAddrs []netlink.Addr
	if link != nil {
		found.Interface = true
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			errs = append(errs, fmt.Errorf("addresses of %s: %w", kubeIPVSInterface, err))
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				bound[ip.Unmap()] = true
			}
		}
		linkAddrs = addrs
	}
	kept := map[netip.Addr]bool{}
	local, err := localAddrSet()
	if err != nil {
		errs = append(errs, err)
	}
	// /proc/net/ip_vs exists where the ip_vs module is loaded: without it
	// there are no virtual servers, and ipvs.New would run modprobe.
	var h *ipvs.Handle
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		found.Skipped = "IPVS is not loaded in this kernel"
	} else if h, err = ipvs.New(""); err != nil {
		found.Skipped = "no IPVS: " + err.Error()
	} else {
		defer h.Close()
		svcs, err := h.GetServices()
		if err != nil {
			found.Skipped = "no IPVS: " + err.Error()
		}
		for _, s := range svcs {
			ip, ok := netip.AddrFromSlice(s.Address)
			if !ok || s.FWMark != 0 {
				continue
			}
			ip = ip.Unmap()
			isNodePort := !bound[ip] && local[ip] && containsNodePort(nodePorts, s.Protocol, s.Port)
			if !bound[ip] && !isNodePort {
				continue
			}
			found.VirtualServers++
			if how == RemoveIdle && kpipvs.InUse(h, s) {
				found.Kept++
				kept[ip] = true
				continue
			}
			if remove {
				if err := h.DelService(s); err != nil {
					errs = append(errs, fmt.Errorf("delete IPVS virtual server %s:%d: %w", ip, s.Port, err))
				}
			}
		}
	}
	switch {
	case link != nil && remove && found.Kept > 0:
		for _, a := range linkAddrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && !kept[ip.Unmap()] {
				if err := netlink.AddrDel(link, &a); err != nil {
					errs = append(errs, fmt.Errorf("delete %s from %s: %w", ip, kubeIPVSInterface, err))
				}
			}
		}
	case link != nil && remove:
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", kubeIPVSInterface, err))
		}
	}
	sets, err := listIPSets(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range sets {
		if !isKubeProxyIPSet(name) {
			continue
		}
		found.IPSets = append(found.IPSets, name)
		if remove && found.Kept == 0 {
			if out, err := exec.CommandContext(ctx, "ipset", "destroy", name).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ipset destroy %s: %v: %s", name, err, strings.TrimSpace(string(out))))
			}
		}
	}
	return found, errors.Join(errs...)
}

func containsNodePort(ps []NodePort, proto uint16, port uint16) bool {
	for _, p := range ps {
		if p.Protocol == proto && p.Port == port {
			return true
		}
	}
	return false
}

// listIPSets names the namespace's ipsets; no ipset binary means none kp
// could remove (and none kube-proxy, which needs it, could have made).
func listIPSets(ctx context.Context) ([]string, error) {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, nil
	}
	out, err := exec.CommandContext(ctx, "ipset", "list", "-n").Output()
	if err != nil {
		// A kernel without ip_set has no ipsets to remove; kube-proxy's
		// ipvs mode cannot have run there either.
		return nil, nil
	}
	var names []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if n := strings.TrimSpace(sc.Text()); n != "" {
			names = append(names, n)
		}
	}
	return names, nil
}

// localAddrSet is proxy.LocalAddrs as a set.
func localAddrSet() (map[netip.Addr]bool, error) {
	addrs, err := proxy.LocalAddrs()
	if err != nil {
		return nil, fmt.Errorf("list local addresses: %w", err)
	}
	out := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		out[a] = true
	}
	return out, nil
}
