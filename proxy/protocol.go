package proxy

import v1 "k8s.io/api/core/v1"

// The IP protocol numbers (IANA) of the Service protocols, as the kernel's
// nftables, conntrack and IPVS carry them.
const (
	ProtocolNumberTCP  uint8 = 6
	ProtocolNumberUDP  uint8 = 17
	ProtocolNumberSCTP uint8 = 132
)

// ProtocolNumber is p's IP protocol number; anything but UDP and SCTP is
// TCP, the Service API's default.
func ProtocolNumber(p v1.Protocol) uint8 {
	switch p {
	case v1.ProtocolUDP:
		return ProtocolNumberUDP
	case v1.ProtocolSCTP:
		return ProtocolNumberSCTP
	}
	return ProtocolNumberTCP
}

// ProtocolOf is the Service protocol with IP protocol number n, or "" for
// a protocol a Service cannot have.
func ProtocolOf(n uint8) v1.Protocol {
	switch n {
	case ProtocolNumberTCP:
		return v1.ProtocolTCP
	case ProtocolNumberUDP:
		return v1.ProtocolUDP
	case ProtocolNumberSCTP:
		return v1.ProtocolSCTP
	}
	return ""
}
