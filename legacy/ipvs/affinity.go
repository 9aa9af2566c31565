package ipvs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// procIPVSConn lists a network namespace's IPVS connections, persistence
// templates among them; the calling thread's (as procIPVS). moby/ipvs has
// no connection listing, and the IPVS netlink family none either.
const procIPVSConn = "/proc/thread-self/net/ip_vs_conn"

// ListAffinity implements proxy.AffinityLister: ClientIP affinity is IPVS
// persistence, whose state is a template connection per client and
// virtual server (client port 0) naming the real server the client's next
// connections go to while it lives. Its life is the persistence timeout
// from the last connection it placed, and IPVS keeps it while a connection
// it placed lives. Templates are told to a service port by their virtual
// server (a ClusterIP, external or LoadBalancer address and port, or a
// NodePort), each entry carrying its own (Frontend).
func (b *Backend) ListAffinity(ctx context.Context, s *proxy.State) ([]proxy.AffinityEntry, error) {
	f, err := os.Open(procIPVSConn)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no IPVS in this namespace yet
	}
	if err != nil {
		return nil, fmt.Errorf("read the IPVS persistence templates: %w", err)
	}
	defer f.Close()
	conns, err := parseIPVSConn(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", procIPVSConn, err)
	}
	return templateEntries(s, conns), ctx.Err()
}

// templateEntries are the templates of conns that belong to a service port
// of s with ClientIP affinity.
func templateEntries(s *proxy.State, conns []ipvsConn) []proxy.AffinityEntry {
	type vsKey struct {
		proto v1.Protocol
		ap    netip.AddrPort
	}
	type npKey struct {
		proto v1.Protocol
		port  uint16
	}
	byAddr, byNodePort := map[vsKey]proxy.ServicePortName{}, map[npKey]proxy.ServicePortName{}
	for name, sp := range s.Services {
		if sp.AffinityTimeout <= 0 {
			continue
		}
		for _, addrs := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
			for _, a := range addrs {
				byAddr[vsKey{sp.Protocol, netip.AddrPortFrom(a, uint16(sp.Port))}] = name
			}
		}
		if sp.NodePort > 0 {
			byNodePort[npKey{sp.Protocol, uint16(sp.NodePort)}] = name
		}
	}
	var out []proxy.AffinityEntry
	for _, c := range conns {
		if c.client.Port() != 0 {
			continue // a connection, not a template
		}
		name, ok := byAddr[vsKey{c.proto, c.virtual}]
		if !ok {
			if name, ok = byNodePort[npKey{c.proto, c.virtual.Port()}]; !ok {
				continue
			}
		}
		out = append(out, proxy.AffinityEntry{ServicePort: name, Client: c.client.Addr(), Endpoint: c.real,
			Frontend: c.virtual, Expires: c.expires})
	}
	return out
}

// ipvsConn is one line of /proc/net/ip_vs_conn.
type ipvsConn struct {
	proto                 v1.Protocol
	client, virtual, real netip.AddrPort
	state                 string
	expires               time.Duration
}

// parseIPVSConn reads /proc/net/ip_vs_conn:
//
//	Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
//	TCP 0AF40263 0000 0A60000B 0050 0AF40102 1F90 NONE           3599
//
// IPv4 addresses in hex, IPv6 ones as %pI6 prints them; ports in hex;
// Expires in seconds. Lines of other protocols (IP: firewall-mark
// templates) are skipped.
func parseIPVSConn(r io.Reader) ([]ipvsConn, error) {
	var out []ipvsConn
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if n == 1 && len(f) > 0 && f[0] == "Pro" {
			continue
		}
		if len(f) == 0 {
			continue
		}
		if len(f) < 9 {
			return nil, fmt.Errorf("line %d %q: want 9 fields or more", n, sc.Text())
		}
		proto := v1.Protocol(f[0])
		if proto != v1.ProtocolTCP && proto != v1.ProtocolUDP && proto != v1.ProtocolSCTP {
			continue
		}
		c := ipvsConn{proto: proto, state: f[7]}
		var err error
		for i, dst := range []*netip.AddrPort{&c.client, &c.virtual, &c.real} {
			if *dst, err = hexAddrPort(f[1+2*i], f[2+2*i]); err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
		}
		secs, err := strconv.ParseUint(f[8], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("line %d: expires %q: %w", n, f[8], err)
		}
		c.expires = time.Duration(secs) * time.Second
		out = append(out, c)
	}
	return out, sc.Err()
}
