package ipvs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"
)

// procIPVS lists a network namespace's IPVS table, every virtual server
// with its real servers, in one read: where the drift check reads it
// (thread-self: a caller that entered another namespace did so on its own
// locked thread). Through netlink the same takes one dump per virtual
// server: at 10,000 Services × 10 in the VM a check took 26.5 s that way
// and 6.1 s with this file (test/bench/NOTES.md, "Drift repair").
const procIPVS = "/proc/thread-self/net/ip_vs"

// readTable reads every virtual server with its real servers, keyed: from
// b.procTable when it is set and readable, else through the IPVS socket.
func (b *Backend) readTable() (map[vsKey]*kernelServer, error) {
	if b.procTable != "" {
		f, err := os.Open(b.procTable)
		if err == nil {
			defer f.Close()
			return parseProcIPVS(f)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	servers, err := b.handle.GetServices()
	if err != nil {
		return nil, fmt.Errorf("list IPVS virtual servers: %w", err)
	}
	out := map[vsKey]*kernelServer{}
	for _, ks := range servers {
		k, ok := kernelKey(ks)
		if !ok {
			continue
		}
		dests, err := b.handle.GetDestinations(ks)
		if err != nil {
			return nil, fmt.Errorf("read the real servers of %s: %w", k, err)
		}
		out[k] = &kernelServer{svc: ks, dests: dests}
	}
	return out, nil
}

// parseProcIPVS reads /proc/net/ip_vs (ip_vs_ctl.c's ip_vs_info_seq_show):
//
//	IP Virtual Server version 1.2.1 (size=4096)
//	Prot LocalAddress:Port Scheduler Flags
//	  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
//	TCP  0A60000A:0050 rr persistent 10800 FFFFFFFF
//	  -> 0AF40102:1F90      Masq    1      0          0
//	UDP  [fd00:0096:0000:0000:0000:0000:0000:000a]:0035 rr
//
// IPv4 addresses and ports in hex, IPv6 addresses in full; firewall-mark
// servers (FWM) are skipped. A persistent server's timeout is as the
// kernel prints it (procTimeout).
func parseProcIPVS(r io.Reader) (map[vsKey]*kernelServer, error) {
	out := map[vsKey]*kernelServer{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var cur *kernelServer
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if n <= 3 || len(f) == 0 {
			continue // the headers
		}
		if f[0] == "->" {
			if cur == nil {
				continue // a firewall-mark server's
			}
			d, err := procDest(f)
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %w", procIPVS, n, err)
			}
			cur.dests = append(cur.dests, d)
			continue
		}
		ks, err := procServer(f)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %w", procIPVS, n, err)
		}
		cur = nil
		if k, ok := kernelKey(ks.svc); ok {
			cur = ks
			out[k] = cur
		}
	}
	return out, sc.Err()
}

// procServer parses a virtual server's line.
func procServer(f []string) (*kernelServer, error) {
	proto := v1.Protocol(f[0])
	if proto == "FWM" {
		return &kernelServer{svc: &ipvs.Service{FWMark: 1}}, nil // not kp's: kernelKey skips it
	}
	if len(f) < 3 {
		return nil, fmt.Errorf("virtual server line %q", strings.Join(f, " "))
	}
	ap, err := procAddrPort(f[1])
	if err != nil {
		return nil, err
	}
	svc := keyService(vsKey{Proto: proto, Addr: ap.Addr(), Port: ap.Port()})
	svc.SchedName = f[2]
	for i := 3; i < len(f); i++ {
		if f[i] == "persistent" && i+1 < len(f) {
			t, err := strconv.ParseUint(f[i+1], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("persistence timeout %q", f[i+1])
			}
			svc.Flags |= ipvsFlagPersistent
			svc.Timeout = uint32(t)
		}
	}
	return &kernelServer{svc: svc, procTimeout: true}, nil
}

// procDest parses a real server's line: "->", address, forward, weight,
// active and inactive connections.
func procDest(f []string) (*ipvs.Destination, error) {
	if len(f) < 6 {
		return nil, fmt.Errorf("real server line %q", strings.Join(f, " "))
	}
	ap, err := procAddrPort(f[1])
	if err != nil {
		return nil, err
	}
	var nums [3]int
	for i := range nums {
		if nums[i], err = strconv.Atoi(f[3+i]); err != nil {
			return nil, fmt.Errorf("real server %s: %q is not a number", ap, f[3+i])
		}
	}
	d := destination(ap, nums[0])
	d.ActiveConnections, d.InactiveConnections = nums[1], nums[2]
	return d, nil
}

// procAddrPort parses "0A60000A:0050" (IPv4, hex) or "[fd00:…]:0035".
func procAddrPort(s string) (netip.AddrPort, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	ap, err := hexAddrPort(s[:i], s[i+1:])
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: %w", s, err)
	}
	return ap, nil
}

// hexAddrPort parses the address and port of a /proc/net/ip_vs* line:
// the port in hex, an IPv4 address in hex ("0A60000A"), an IPv6 one as
// %pI6 prints it, bracketed ("[fd00::1]", ip_vs) or not (ip_vs_conn).
func hexAddrPort(host, port string) (netip.AddrPort, error) {
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q", port)
	}
	if strings.Contains(host, ":") {
		a, err := netip.ParseAddr(strings.Trim(host, "[]"))
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("address %q: %w", host, err)
		}
		return netip.AddrPortFrom(a, uint16(p)), nil
	}
	v, err := strconv.ParseUint(host, 16, 32)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q", host)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), uint16(p)), nil
}

// sameTimeout reports whether a persistence timeout the kernel printed in
// /proc (in seconds, or in jiffies: the file prints the kernel's own
// value, which it keeps in jiffies) is want seconds, for any of the HZ a
// kernel is built with.
func sameTimeout(printed, want uint32) bool {
	for _, hz := range []uint32{1, 100, 250, 300, 1000} {
		if printed == want*hz {
			return true
		}
	}
	return false
}
