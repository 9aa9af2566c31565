package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/test/netns"
)

// kernelWatch listens to a namespace's nf_tables events (the multicast
// group nft monitor reads) and notes, for each address it was told to
// expect, when the first new rule or set element naming it arrived: the
// kernel sends them once the transaction is committed, so that is when the
// kernel holds the change, whoever wrote it (kp's netlink, upstream's nft,
// iptables-nft-restore).
//
// Why not nft monitor itself: nft keeps a cache of the ruleset to print
// events as text, and at thousands of Services it falls seconds behind
// (monitorMaxN). The watch decodes nothing: it looks for the address's four
// bytes (network order, as every nf_tables data value holds an IPv4
// address) in the message, which costs the same at any N.
type kernelWatch struct {
	fd      int
	prefix  byte // first byte of every address expected (churnBase)
	stopped atomic.Bool
	done    chan struct{}

	mu       sync.Mutex
	expected map[[4]byte]*expectation
	overruns int
}

// expectation is one change the watch waits for: sent when its API write
// was sent; seen when an event first named it (zero until then).
type expectation struct {
	sent, seen time.Time
}

// nf_tables' netlink numbers (linux/netfilter/nfnetlink.h, nf_tables.h).
const (
	nfnlGroupNFTables = 7  // NFNLGRP_NFTABLES
	nfnlSubsysNFT     = 10 // NFNL_SUBSYS_NFTABLES
	nftMsgNewRule     = 6  // NFT_MSG_NEWRULE
	nftMsgNewSetElem  = 12 // NFT_MSG_NEWSETELEM
	nlmsgHeaderLen    = 16
)

// watchKernel opens the event socket in namespace ns; every address
// expected must start with byte prefix.
func watchKernel(ns string, prefix byte) (*kernelWatch, error) {
	w := &kernelWatch{fd: -1, prefix: prefix, done: make(chan struct{}), expected: map[[4]byte]*expectation{}}
	// A socket belongs to the namespace of the thread that opened it.
	err := netns.InNamespace(ns, func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		w.fd = fd
		return nil
	})
	if err != nil {
		return nil, err
	}
	// A large buffer: a proxy's full resync writes thousands of rules at
	// once (overflows are counted, not hidden).
	if err := unix.SetsockoptInt(w.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20); err != nil {
		unix.Close(w.fd)
		return nil, fmt.Errorf("SO_RCVBUFFORCE: %w", err)
	}
	// The reader checks for stop between receives.
	tv := unix.Timeval{Usec: 200000}
	if err := unix.SetsockoptTimeval(w.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(w.fd)
		return nil, fmt.Errorf("SO_RCVTIMEO: %w", err)
	}
	if err := unix.Bind(w.fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (nfnlGroupNFTables - 1)}); err != nil {
		unix.Close(w.fd)
		return nil, fmt.Errorf("join NFNLGRP_NFTABLES: %w", err)
	}
	go w.read()
	return w, nil
}

// expect registers addr's change, its write sent at sent: call it before
// the write, so no event can come first.
func (w *kernelWatch) expect(addr netip.Addr, sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expected[addr.As4()] = &expectation{sent: sent}
}

// forget drops addr's expectation (its write failed).
func (w *kernelWatch) forget(addr netip.Addr) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.expected, addr.As4())
}

// seen is when an event first named addr (ok false: not yet, or never
// expected).
func (w *kernelWatch) seen(addr netip.Addr) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.expected[addr.As4()]
	if e == nil || e.seen.IsZero() {
		return 0, false
	}
	return e.seen.Sub(e.sent), true
}

// pending counts the expected addresses not seen yet.
func (w *kernelWatch) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.expected {
		if e.seen.IsZero() {
			n++
		}
	}
	return n
}

func (w *kernelWatch) overflows() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overruns
}

func (w *kernelWatch) stop() {
	w.stopped.Store(true)
	<-w.done
	unix.Close(w.fd)
}

func (w *kernelWatch) read() {
	defer close(w.done)
	buf := make([]byte, 1<<20)
	for !w.stopped.Load() {
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		at := time.Now()
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOBUFS):
			w.mu.Lock()
			w.overruns++
			w.mu.Unlock()
			continue
		case err != nil:
			return
		}
		w.scan(buf[:n], at)
	}
}

// scan looks for expected addresses in the new rules and set elements of
// one datagram of events, received at.
func (w *kernelWatch) scan(b []byte, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(b) >= nlmsgHeaderLen {
		size := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if size < nlmsgHeaderLen || size > len(b) {
			return
		}
		if typ>>8 == nfnlSubsysNFT && (typ&0xff == nftMsgNewRule || typ&0xff == nftMsgNewSetElem) {
			w.match(b[nlmsgHeaderLen:size], at)
		}
		b = b[min((size+3)&^3, len(b)):]
	}
}

func (w *kernelWatch) match(payload []byte, at time.Time) {
	for i := 0; i+4 <= len(payload); i++ {
		if payload[i] != w.prefix {
			continue
		}
		if e := w.expected[[4]byte(payload[i:i+4])]; e != nil && e.seen.IsZero() {
			e.seen = at
		}
	}
}

// probe writes a transaction naming churnProbe in namespace ns and waits
// for the watch to see it: the watch works there before the phase begins.
func (w *kernelWatch) probe(ns string) error {
	w.expect(churnProbe, time.Now())
	script := fmt.Sprintf("add table ip kp-bench-probe; add chain ip kp-bench-probe c; "+
		"add rule ip kp-bench-probe c ip daddr %s accept; delete table ip kp-bench-probe", churnProbe)
	if out, err := netns.Exec(ns, "nft", script); err != nil {
		return fmt.Errorf("probe transaction: %v: %s", err, out)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, ok := w.seen(churnProbe); ok {
			return nil
		}
	}
	return fmt.Errorf("the kernel-event watch saw no event of its probe transaction in 10 s")
}
