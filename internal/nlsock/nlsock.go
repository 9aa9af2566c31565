// Package nlsock sizes the netlink sockets kp sends nftables transactions
// through, for the modes that write nftables (nft, legacy/userspace).
package nlsock

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Bounds of a sized buffer: at least the nft CLI's megabyte, at most what
// setsockopt takes.
const (
	minBuffer = 1 << 20
	maxBuffer = 1<<31 - 1
)

// Clamp bounds a buffer size between 1 MiB and setsockopt's largest.
func Clamp(bytes int) int { return min(max(bytes, minBuffer), maxBuffer) }

// Buffers sets the send and receive buffers of a netlink socket (clamped)
// for a transaction of ops messages. google/nftables sends a transaction
// in one sendmsg, which the kernel refuses (EMSGSIZE) beyond the send
// buffer (212 kB by default), and a batch that fails everywhere queues an
// error per message before kp reads any, which overruns the default
// receive buffer. The *FORCE options need CAP_NET_ADMIN, which kp has
// anyway; they set limits, not allocations.
func Buffers(ops, snd, rcv int) nftables.SockOption {
	snd, rcv = Clamp(snd), Clamp(rcv)
	return func(conn *netlink.Conn) error {
		raw, err := conn.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		err = raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, snd)
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcv)
			}
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("size the netlink socket for %d operations: %w", ops, serr)
		}
		return nil
	}
}
