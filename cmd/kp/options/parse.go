package options

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// parseClusterCIDRs parses upstream's --cluster-cidr: one CIDR, or a
// comma-separated pair of one IPv4 and one IPv6 CIDR.
// PlaceholderClusterCIDR is the clusterCIDR manifests/configmap.yaml ships,
// for the operator to replace: kp refuses to start on it.
const PlaceholderClusterCIDR = "CLUSTER-POD-CIDRS"

func parseClusterCIDRs(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	items := strings.Split(s, ",")
	cidrs, err := parseCIDRs(items)
	if err != nil {
		return nil, err
	}
	if len(cidrs) > 2 || (len(cidrs) == 2 && cidrs[0].Addr().Is4() == cidrs[1].Addr().Is4()) {
		return nil, errors.New("want one CIDR, or one IPv4 and one IPv6 CIDR for dual-stack")
	}
	return cidrs, nil
}

// parseServiceCIDRs parses --service-cidrs: any number of CIDRs of either
// family. A CIDR covering a whole family (0.0.0.0/0) would drop traffic to
// every address that is not a Service, so it is refused.
func parseServiceCIDRs(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	cidrs, err := parseCIDRs(strings.Split(s, ","))
	if err != nil {
		return nil, err
	}
	for _, p := range cidrs {
		if p.Bits() == 0 {
			return nil, fmt.Errorf("%s covers every address; give the Service CIDRs only", p)
		}
	}
	return cidrs, nil
}

// parseNodePortAddresses parses upstream's --nodeport-addresses: CIDRs, or
// the word "primary" alone.
func parseNodePortAddresses(items []string) (cidrs []netip.Prefix, primary bool, err error) {
	var rest []string
	for _, it := range items {
		switch strings.TrimSpace(it) {
		case "":
		case "primary":
			primary = true
		default:
			rest = append(rest, it)
		}
	}
	if primary && len(rest) > 0 {
		return nil, false, errors.New("'primary' cannot be combined with CIDRs")
	}
	cidrs, err = parseCIDRs(rest)
	return cidrs, primary, err
}

func parseCIDRs(items []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, it := range items {
		it = strings.TrimSpace(it)
		p, err := netip.ParsePrefix(it)
		if err != nil {
			if len(items) == 1 {
				return nil, errors.New("invalid CIDR")
			}
			return nil, fmt.Errorf("invalid CIDR %q", it)
		}
		// Upstream accepts host bits (10.0.0.1/8) and means the network.
		out = append(out, p.Masked())
	}
	return out, nil
}

func checkMasqueradeBit(bit int32) error {
	if bit < 0 || bit > 31 {
		return errors.New("must be within [0, 31]")
	}
	return nil
}

func checkDuration(d time.Duration, zeroOK bool) error {
	switch {
	case d < 0:
		return errors.New("must not be negative")
	case d == 0 && !zeroOK:
		return errors.New("must be greater than 0")
	}
	return nil
}

// checkBindAddress accepts "IP:port", ":port", or "" (server disabled), as
// upstream does.
func checkBindAddress(s string) error {
	if s == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("want IP:port, for example 0.0.0.0:10256")
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("%q is not an IP address", host)
		}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q is not a port number", port)
	}
	return nil
}

// appendPortIfNeeded is upstream's proxyutil.AppendPortIfNeeded: a bind
// address that is a bare IP gets port; anything else stays as it is (and
// is validated as it is).
func appendPortIfNeeded(addr string, port int32) string {
	if _, _, err := net.SplitHostPort(addr); err == nil || addr == "" {
		return addr
	}
	ip, err := netip.ParseAddr(strings.Trim(addr, "[]"))
	if err != nil {
		return addr
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))
}
