package iptables

import (
	"encoding/binary"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/internal/nftgen"
	"github.com/kpproxy/kp/proxy"
)

// Stamp is a cheap sign of change of one flavor and family's tables: when
// it has not moved since kp wrote them, nothing changed there, and a drift
// check need not read them. iptables-legacy: the nat and filter tables'
// entry counts and sizes, as the kernel reports them (IPT_SO_GET_INFO, one
// getsockopt each). iptables-nft: the nftables ruleset's generation, which
// moves at every transaction of anyone, kp's included. A rule replaced by
// one of the same size leaves a legacy table's stamp as it was. At 10,000
// Services × 10 endpoints reading the Stamp took 28 µs (legacy) and 0.15 ms
// (nft), reading and comparing the tables 2.0 s and 8.1 s
// (test/bench/NOTES.md, "Drift repair").
type Stamp struct {
	entries, size [2]uint32 // nat, filter (legacy)
	gen           uint32    // nft
}

// StampReader reads the Stamps of one flavor and family in the network
// namespace it was opened in. It is safe for concurrent use.
type StampReader struct {
	fl Flavor
	f  proxy.Family

	mu   sync.Mutex
	gens *nftgen.Reader // iptables-nft: opened at the first Read, kept
}

// NewStampReader returns a reader of fl's and f's Stamps.
func NewStampReader(fl Flavor, f proxy.Family) *StampReader { return &StampReader{fl: fl, f: f} }

// Read returns the Stamp now, read in the calling thread's network
// namespace (iptables-nft: the one of the first Read).
func (r *StampReader) Read() (Stamp, error) {
	var s Stamp
	if r.fl == FlavorLegacy {
		for i, t := range []Table{TableNAT, TableFilter} {
			var err error
			if s.entries[i], s.size[i], err = legacyTableInfo(r.f, t); err != nil {
				return s, err
			}
		}
		return s, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gens == nil {
		g, err := nftgen.Open(0)
		if err != nil {
			return s, err
		}
		r.gens = g
	}
	gen, err := r.gens.Read()
	if err != nil {
		_ = r.gens.Close()
		r.gens = nil
		return s, err
	}
	s.gen = gen
	return s, nil
}

// Close closes the reader's socket.
func (r *StampReader) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gens != nil {
		_ = r.gens.Close()
		r.gens = nil
	}
}

// soGetInfo is IPT_SO_GET_INFO and IP6T_SO_GET_INFO (IPT_BASE_CTL): a
// table's struct ipt_getinfo: name[32], valid_hooks, hook_entry[5],
// underflow[5], num_entries, size.
const (
	soGetInfo      = 64
	getInfoLen     = 84
	getInfoEntries = 76
	getInfoSize    = 80
)

// legacyTableInfo is iptables-legacy's entry count and size of table t of
// family f in the calling thread's network namespace. It needs CAP_NET_RAW
// (a raw socket), as iptables-legacy itself does.
func legacyTableInfo(f proxy.Family, t Table) (entries, size uint32, err error) {
	domain, level := unix.AF_INET, unix.SOL_IP
	if f == proxy.IPv6 {
		domain, level = unix.AF_INET6, unix.SOL_IPV6
	}
	fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return 0, 0, fmt.Errorf("iptables-legacy %s %s table: open a raw socket: %w", f, t, err)
	}
	defer unix.Close(fd)
	var info [getInfoLen]byte
	copy(info[:31], t)
	l := uint32(len(info))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), soGetInfo,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return 0, 0, fmt.Errorf("iptables-legacy %s %s table: %w", f, t, errno)
	}
	return binary.NativeEndian.Uint32(info[getInfoEntries:]), binary.NativeEndian.Uint32(info[getInfoSize:]), nil
}
