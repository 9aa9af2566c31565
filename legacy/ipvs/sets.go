package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// setKind names one of kp's ipsets, family aside: upstream's KUBE- sets
// under KP- (and KP-6- for IPv6, as upstream's KUBE-6-).
type setKind string

const (
	setClusterIP         setKind = "CLUSTER-IP"
	setLoopBack          setKind = "LOOP-BACK"
	setExternalIP        setKind = "EXTERNAL-IP"
	setExternalIPLocal   setKind = "EXTERNAL-IP-LOCAL"
	setLoadBalancer      setKind = "LOAD-BALANCER"
	setLoadBalancerFW    setKind = "LOAD-BALANCER-FW"
	setLoadBalancerLocal setKind = "LOAD-BALANCER-LOCAL"
	setLBSourceIP        setKind = "LOAD-BALANCER-SOURCE-IP"
	setLBSourceCIDR      setKind = "LOAD-BALANCER-SOURCE-CIDR"
	setNodePortTCP       setKind = "NODE-PORT-TCP"
	setNodePortLocalTCP  setKind = "NODE-PORT-LOCAL-TCP"
	setNodePortUDP       setKind = "NODE-PORT-UDP"
	setNodePortLocalUDP  setKind = "NODE-PORT-LOCAL-UDP"
	setNodePortSCTP      setKind = "NODE-PORT-SCTP"
	setNodePortLocalSCTP setKind = "NODE-PORT-LOCAL-SCTP"
	setHealthCheck       setKind = "HEALTH-CHECK-NODE-PORT"
	setIPVSIPs           setKind = "IPVS-IPS"
	// setServers is kp's own: every virtual server kp created (address,
	// protocol and port), so that a restarted kp, and kp cleanup, tell
	// kp's NodePort servers on node addresses from other programs'.
	setServers setKind = "IPVS-SERVERS"
)

// setKinds is every set, in the order they are created.
var setKinds = []setKind{setClusterIP, setLoopBack, setExternalIP, setExternalIPLocal, setLoadBalancer,
	setLoadBalancerFW, setLoadBalancerLocal, setLBSourceIP, setLBSourceCIDR, setNodePortTCP, setNodePortLocalTCP,
	setNodePortUDP, setNodePortLocalUDP, setNodePortSCTP, setNodePortLocalSCTP, setHealthCheck, setIPVSIPs, setServers}

// setType is the kind's ipset type, as upstream's.
func (k setKind) setType() string {
	switch k {
	case setLoopBack, setLBSourceIP:
		return "hash:ip,port,ip"
	case setLBSourceCIDR:
		return "hash:ip,port,net"
	case setNodePortTCP, setNodePortLocalTCP, setNodePortUDP, setNodePortLocalUDP, setHealthCheck:
		return "bitmap:port"
	case setIPVSIPs:
		return "hash:ip"
	}
	return "hash:ip,port"
}

// setName is the kind's set in family f.
func setName(f proxy.Family, k setKind) string {
	if f == proxy.IPv6 {
		return "KP-6-" + string(k)
	}
	return "KP-" + string(k)
}

// allSetNames is every set kp may have created, both families.
func allSetNames() []string {
	var out []string
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		for _, k := range setKinds {
			out = append(out, setName(f, k))
		}
	}
	return out
}

// createLine is the ipset restore line creating set k of family f.
func createLine(f proxy.Family, k setKind, name string) string {
	t := k.setType()
	line := "create " + name + " " + t
	if t == "bitmap:port" {
		return line + " range 0-65535"
	}
	fam := "inet"
	if f == proxy.IPv6 {
		fam = "inet6"
	}
	// maxelem: 10,000 Services × 10 endpoints is 100,000 loop-back
	// entries, past ipset's default of 65,536.
	return line + " family " + fam + " hashsize 1024 maxelem 1048576"
}

func protoLower(p v1.Protocol) string { return strings.ToLower(string(p)) }

// ipPort is a hash:ip,port entry: "10.96.0.10,tcp:80".
func ipPort(a netip.Addr, p v1.Protocol, port int32) string {
	return a.String() + "," + protoLower(p) + ":" + strconv.Itoa(int(port))
}

// setEntry is one element of one set.
type setEntry struct {
	Kind  setKind
	Entry string
}

// fullSetsInput rewrites every set of the families: each is filled under a
// temporary name and swapped in, so packets never see it half filled.
func fullSetsInput(byFamily map[proxy.Family]*written, fams []proxy.Family) []byte {
	var w strings.Builder
	for _, f := range fams {
		byKind := map[setKind][]string{}
		for e := range byFamily[f].entries {
			byKind[e.Kind] = append(byKind[e.Kind], e.Entry)
		}
		for i, k := range setKinds {
			name, tmp := setName(f, k), fmt.Sprintf("KP-TMP-%d-%d", f, i)
			w.WriteString(createLine(f, k, name) + " -exist\n")
			w.WriteString(createLine(f, k, tmp) + " -exist\n")
			w.WriteString("flush " + tmp + "\n")
			entries := byKind[k]
			slices.Sort(entries)
			for _, e := range entries {
				w.WriteString("add " + tmp + " " + e + " -exist\n")
			}
			w.WriteString("swap " + tmp + " " + name + "\n")
			w.WriteString("destroy " + tmp + "\n")
		}
	}
	return []byte(w.String())
}

// partialSetsInput adds and deletes the entries the changes name.
func partialSetsInput(changes map[proxy.Family]*change, fams []proxy.Family) []byte {
	var w strings.Builder
	for _, f := range fams {
		c := changes[f]
		for _, e := range c.delEntries {
			w.WriteString("del " + setName(f, e.Kind) + " " + e.Entry + " -exist\n")
		}
		for _, e := range c.addEntries {
			w.WriteString("add " + setName(f, e.Kind) + " " + e.Entry + " -exist\n")
		}
	}
	return []byte(w.String())
}

// parseIPPort reads a hash:ip,port entry ("10.96.0.10,tcp:80").
func parseIPPort(e string) (vsKey, bool) {
	ip, pp, ok := strings.Cut(e, ",")
	if !ok {
		return vsKey{}, false
	}
	proto, port, ok := strings.Cut(pp, ":")
	a, err := netip.ParseAddr(ip)
	n, perr := strconv.ParseUint(port, 10, 16)
	if !ok || err != nil || perr != nil {
		return vsKey{}, false
	}
	return vsKey{Proto: v1.Protocol(strings.ToUpper(proto)), Addr: a, Port: uint16(n)}, true
}
