package proxy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// parseIP parses an IP address the way upstream's ParseIPSloppy does, which
// is what the API server's legacy IP fields (clusterIPs, externalIPs,
// load balancer ingress, endpoint addresses) accept unless its
// StrictIPCIDRValidation gate is on, and what objects stored before that
// gate still hold: IPv4 octets with leading zeros are read as decimal.
// IPv4-mapped IPv6 addresses are unmapped, so every IPv4 address has one
// form. Zones are rejected.
func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		var ok bool
		if a, ok = parseIPSloppy(s); !ok {
			return netip.Addr{}, fmt.Errorf("invalid IP address %q", s)
		}
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("invalid IP address %q: zones are not allowed", s)
	}
	return a.Unmap(), nil
}

// parseIPSloppy reads what netip refuses and ParseIPSloppy accepts: leading
// zeros in an IPv4 address, alone or as the dotted tail of an IPv6 one
// ("::ffff:010.1.2.3").
func parseIPSloppy(s string) (netip.Addr, bool) {
	colon := strings.LastIndexByte(s, ':')
	if colon < 0 {
		return parseIPv4Sloppy(s)
	}
	v4, ok := parseIPv4Sloppy(s[colon+1:])
	if !ok {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s[:colon+1] + v4.String())
	return a, err == nil
}

// parseIPv4Sloppy reads d.d.d.d where each part is decimal digits (as many as
// the writer liked) of a value up to 255, as ParseIPSloppy does.
func parseIPv4Sloppy(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		if p == "" || strings.TrimLeft(p, "0123456789") != "" {
			return netip.Addr{}, false
		}
		n := 0
		for _, d := range p {
			if n = n*10 + int(d-'0'); n > 255 {
				return netip.Addr{}, false
			}
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// parsePrefix parses a CIDR the way the API server's legacy CIDR fields
// (loadBalancerSourceRanges and its annotation) accept it when not strict,
// as objects stored before StrictIPCIDRValidation may still hold it:
// leading zeros in the address (see parseIP) or in the length, and host
// bits set ("10.0.0.1/8" is 10.0.0.0/8). The result is masked. An
// IPv4-mapped IPv6 prefix of length 96 or more is the IPv4 prefix it maps,
// as upstream kube-proxy reads it.
func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return unmapPrefix(p)
	}
	addr, length, ok := strings.Cut(s, "/")
	bad := fmt.Errorf("invalid CIDR %q", s)
	if !ok || length == "" || strings.TrimLeft(length, "0123456789") != "" || len(length) > 5 {
		return netip.Prefix{}, bad
	}
	bits, _ := strconv.Atoi(length)
	a, err := netip.ParseAddr(addr)
	if err != nil {
		var sloppy bool
		if a, sloppy = parseIPSloppy(addr); !sloppy {
			return netip.Prefix{}, bad
		}
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: zones are not allowed", s)
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return netip.Prefix{}, bad
	}
	return unmapPrefix(p)
}

func unmapPrefix(p netip.Prefix) (netip.Prefix, error) {
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: zones are not allowed", p)
	}
	p = p.Masked()
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96), nil
	}
	return p, nil
}

func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}
