package explain

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// Packet is the first packet of a connection kp explain is asked about.
type Packet struct {
	Dst      netip.AddrPort
	Protocol v1.Protocol
	// Src is the client's address; invalid when not given. SrcPort is 0
	// when not given.
	Src     netip.Addr
	SrcPort uint16
}

// ParsePacket reads kp explain's arguments: the destination
// "IP:PORT[/tcp|udp|sctp]" ("[IPv6]:PORT/udp"; TCP when no protocol is
// given) and, when from is not empty, the source "IP" or "IP:PORT"
// ("[IPv6]:PORT"). Errors say what is wrong with which argument.
func ParsePacket(dst, from string) (Packet, error) {
	var p Packet
	addr, proto, hasProto := strings.Cut(strings.TrimSpace(dst), "/")
	p.Protocol = v1.ProtocolTCP
	if hasProto {
		switch strings.ToLower(proto) {
		case "tcp":
		case "udp":
			p.Protocol = v1.ProtocolUDP
		case "sctp":
			p.Protocol = v1.ProtocolSCTP
		default:
			return p, fmt.Errorf("destination %s: protocol %s: want tcp, udp or sctp", proxy.QuoteBounded(dst), proxy.QuoteBounded(proto))
		}
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return p, fmt.Errorf("destination %s: want IP:PORT[/tcp|udp|sctp], e.g. 10.96.0.10:53/udp or [fd00::a]:80: %w",
			proxy.QuoteBounded(dst), err)
	}
	if ap.Addr().Zone() != "" {
		return p, fmt.Errorf("destination %s: an address with a zone is no Service address", proxy.QuoteBounded(dst))
	}
	if ap.Port() == 0 {
		return p, fmt.Errorf("destination %s: port 0 is no Service port", proxy.QuoteBounded(dst))
	}
	p.Dst = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if from = strings.TrimSpace(from); from == "" {
		return p, nil
	}
	if a, err := netip.ParseAddr(from); err == nil && a.Zone() == "" {
		p.Src = a.Unmap()
	} else if sp, err := netip.ParseAddrPort(from); err == nil && sp.Addr().Zone() == "" {
		p.Src, p.SrcPort = sp.Addr().Unmap(), sp.Port()
	} else {
		return p, fmt.Errorf("--from %s: want IP or IP:PORT ([IPv6]:PORT)", proxy.QuoteBounded(from))
	}
	if p.Src.Is4() != p.Dst.Addr().Is4() {
		return p, fmt.Errorf("--from %s and destination %s are of different IP families: no packet has both", p.Src, p.Dst.Addr())
	}
	return p, nil
}

// String is the packet as kp explain's arguments spell it.
func (p Packet) String() string {
	s := p.Dst.String() + "/" + strings.ToLower(string(p.Protocol))
	if p.Src.IsValid() {
		src := p.Src.String()
		if p.SrcPort != 0 {
			src = netip.AddrPortFrom(p.Src, p.SrcPort).String()
		}
		s = "from " + src + " to " + s
	}
	return s
}

func portString(p int32) string { return strconv.Itoa(int(p)) }
