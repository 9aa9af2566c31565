package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DummyName is the interface holding the Service addresses (upstream's
// kube-ipvs0): IPVS takes connections in the INPUT hook, so a Service
// address must be local for its packets to get there.
const DummyName = "kp-ipvs0"

// Links manages kp-ipvs0 and its addresses. Fakes keep them in memory.
type Links interface {
	// Ensure creates the interface when missing and sets it up.
	Ensure() error
	// Addrs lists the addresses it holds (none when it is missing).
	Addrs() ([]netip.Addr, error)
	AddAddr(a netip.Addr) error
	DelAddr(a netip.Addr) error
	// Delete removes the interface (nil when it is missing).
	Delete() error
}

type netlinkLinks struct{}

func (netlinkLinks) Ensure() error {
	l, err := netlink.LinkByName(DummyName)
	if err != nil {
		if !errors.As(err, &netlink.LinkNotFoundError{}) {
			return fmt.Errorf("find %s: %w", DummyName, err)
		}
		d := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DummyName}}
		if err := netlink.LinkAdd(d); err != nil {
			return fmt.Errorf("create the dummy interface %s (modprobe dummy?): %w", DummyName, err)
		}
		if l, err = netlink.LinkByName(DummyName); err != nil {
			return fmt.Errorf("find %s: %w", DummyName, err)
		}
	}
	// Up, so IPv6 addresses are usable (an IPv4 address on a down
	// interface is local already); a dummy answers no ARP itself.
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", DummyName, err)
		}
	}
	return nil
}

func (netlinkLinks) link() (netlink.Link, error) {
	l, err := netlink.LinkByName(DummyName)
	if err != nil {
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return nil, nil
		}
		return nil, fmt.Errorf("find %s: %w", DummyName, err)
	}
	return l, nil
}

func (n netlinkLinks) Addrs() ([]netip.Addr, error) {
	l, err := n.link()
	if l == nil || err != nil {
		return nil, err
	}
	as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list %s's addresses: %w", DummyName, err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			ip = ip.Unmap()
			if ip.Is6() && ip.IsLinkLocalUnicast() {
				continue
			}
			out = append(out, ip)
		}
	}
	return out, nil
}

func hostAddr(a netip.Addr) *netlink.Addr {
	bits := 32
	if a.Is6() {
		bits = 128
	}
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, bits)}}
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

func (n netlinkLinks) AddAddr(a netip.Addr) error {
	l, err := n.link()
	if err != nil {
		return err
	}
	if l == nil {
		return fmt.Errorf("add %s to %s: the interface is missing", a, DummyName)
	}
	if err := netlink.AddrReplace(l, hostAddr(a)); err != nil {
		return fmt.Errorf("add %s to %s: %w", a, DummyName, err)
	}
	return nil
}

func (n netlinkLinks) DelAddr(a netip.Addr) error {
	l, err := n.link()
	if l == nil || err != nil {
		return err
	}
	if err := netlink.AddrDel(l, hostAddr(a)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from %s: %w", a, DummyName, err)
	}
	return nil
}

func (n netlinkLinks) Delete() error {
	l, err := n.link()
	if l == nil || err != nil {
		return err
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", DummyName, err)
	}
	return nil
}
