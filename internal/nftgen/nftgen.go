// Package nftgen reads the nftables ruleset's generation: a number the
// kernel increments at every nf_tables transaction in a network namespace,
// whoever commits it (nft, iptables-nft, kp), and announces in a NEWGEN
// message with the pid and name of the process that committed. A
// generation that did not move means nothing in any nftables table
// changed: a check of kp's rules costs one message then.
package nftgen

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Gen is one NEWGEN message: the generation a transaction made, and the
// process that committed it (as the kernel names it: the pid in the
// kernel's initial pid namespace, the thread's name).
type Gen struct {
	ID   uint32
	PID  uint32
	Comm string
}

// Parse decodes a NEWGEN message's payload (the nfgenmsg header, then the
// attributes); attributes a newer kernel adds are skipped.
func Parse(data []byte) (Gen, error) {
	var g Gen
	if len(data) < 4 {
		return g, errors.New("NEWGEN message too short")
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return g, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_GEN_ID:
			g.ID = ad.Uint32()
		case unix.NFTA_GEN_PROC_PID:
			g.PID = ad.Uint32()
		case unix.NFTA_GEN_PROC_NAME:
			g.Comm = ad.String()
		}
	}
	return g, ad.Err()
}

// IsNewGen reports whether m is an nf_tables NEWGEN message.
func IsNewGen(m netlink.Message) bool {
	return m.Header.Type == netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN)
}

// Reader reads the generation of one network namespace over a netlink
// socket it keeps open.
type Reader struct{ conn *netlink.Conn }

// Open returns a Reader of the network namespace nsFd refers to (0: the
// calling thread's).
func Open(nsFd int) (*Reader, error) {
	cfg := &netlink.Config{}
	if nsFd > 0 {
		cfg.NetNS = nsFd
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	return &Reader{conn: conn}, nil
}

// Read returns the current generation.
func (r *Reader) Read() (uint32, error) {
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	}
	msgs, err := r.conn.Execute(req)
	if err != nil {
		return 0, fmt.Errorf("read the nftables generation: %w", err)
	}
	for _, m := range msgs {
		if IsNewGen(m) {
			g, err := Parse(m.Data)
			if err != nil {
				return 0, fmt.Errorf("read the nftables generation: %w", err)
			}
			return g.ID, nil
		}
	}
	return 0, errors.New("read the nftables generation: no NEWGEN in the kernel's answer")
}

// Close closes the socket.
func (r *Reader) Close() error { return r.conn.Close() }
