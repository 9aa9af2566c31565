package ipvs

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// vsKey identifies a virtual server as the kernel does: protocol, address
// and port.
type vsKey struct {
	Proto v1.Protocol
	Addr  netip.Addr
	Port  uint16
}

func (k vsKey) String() string {
	return strings.ToLower(string(k.Proto)) + "/" + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// VirtualServer is one IPVS virtual server kp wants, with its real servers.
type VirtualServer struct {
	Key       vsKey
	Scheduler string
	// Timeout is the ClientIP affinity timeout in seconds (IPVS
	// persistence); 0 is no affinity.
	Timeout uint32
	// Owner is the service port the server was rendered for, so an error
	// names its Service.
	Owner proxy.ServicePortName
	// Dests are the real servers, sorted; each gets weight 1.
	Dests []netip.AddrPort
}

// ipvsFlagPersistent is IP_VS_SVC_F_PERSISTENT.
const ipvsFlagPersistent = 0x1

// service is the virtual server as moby/ipvs spells it.
func (vs *VirtualServer) service() *ipvs.Service {
	s := keyService(vs.Key)
	s.SchedName = vs.Scheduler
	if vs.Timeout > 0 {
		s.Flags = ipvsFlagPersistent
		s.Timeout = vs.Timeout
	}
	return s
}

// keyService is a moby/ipvs Service naming key (enough to get or delete it).
func keyService(k vsKey) *ipvs.Service {
	s := &ipvs.Service{Address: net.IP(k.Addr.AsSlice()), Protocol: uint16(proxy.ProtocolNumber(k.Proto)), Port: k.Port}
	if k.Addr.Is4() {
		s.AddressFamily, s.Netmask = syscall.AF_INET, 0xffffffff
	} else {
		s.AddressFamily, s.Netmask = syscall.AF_INET6, 128
	}
	return s
}

// same reports whether the kernel's virtual server has vs's settings.
func (vs *VirtualServer) same(k *ipvs.Service) bool {
	want := vs.service()
	return k.SchedName == want.SchedName && k.Flags&ipvsFlagPersistent == want.Flags&ipvsFlagPersistent &&
		(want.Flags == 0 || k.Timeout == want.Timeout)
}

func destination(ap netip.AddrPort, weight int) *ipvs.Destination {
	d := &ipvs.Destination{Address: net.IP(ap.Addr().AsSlice()), Port: ap.Port(), Weight: weight,
		ConnectionFlags: ipvs.ConnectionFlagMasq}
	if ap.Addr().Is4() {
		d.AddressFamily = syscall.AF_INET
	} else {
		d.AddressFamily = syscall.AF_INET6
	}
	return d
}

// kernelKey is the key of a virtual server read from the kernel; ok is
// false for one kp never writes (firewall-mark services, unknown protocols).
func kernelKey(s *ipvs.Service) (vsKey, bool) {
	if s.FWMark != 0 {
		return vsKey{}, false
	}
	a, ok := netip.AddrFromSlice(s.Address)
	p := protoOf(s.Protocol)
	if !ok || p == "" {
		return vsKey{}, false
	}
	if s.AddressFamily == syscall.AF_INET {
		a = a.Unmap()
	}
	return vsKey{Proto: p, Addr: a, Port: s.Port}, true
}

func destAddrPort(d *ipvs.Destination) netip.AddrPort {
	a, _ := netip.AddrFromSlice(d.Address)
	if d.AddressFamily == syscall.AF_INET {
		a = a.Unmap()
	}
	return netip.AddrPortFrom(a, d.Port)
}

// protoOf is the Service protocol of an IPVS virtual server's protocol
// number ("" for another).
func protoOf(n uint16) v1.Protocol {
	if n > 255 {
		return ""
	}
	return proxy.ProtocolOf(uint8(n))
}

// Schedulers are the IPVS schedulers --ipvs-scheduler accepts (upstream's
// list: the kernel's, each its module ip_vs_<name>).
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

// CheckScheduler refuses a scheduler IPVS does not have.
func CheckScheduler(name string) error {
	if name == "" || slices.Contains(Schedulers, name) {
		return nil
	}
	return fmt.Errorf("unknown IPVS scheduler; use one of %s", strings.Join(Schedulers, ", "))
}
