package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// google/nftables serializes kp's operations, but kp sends them itself.
// Its Flush asks the kernel to acknowledge every message and reads the
// acknowledgements one recvmsg at a time, each into a fresh page: at 10,000
// Services that is over 200,000 messages, and reading their acks took more
// of kp's CPU and memory than building the transaction. The kernel reports
// a failing message whether or not it was asked to acknowledge it, so kp
// asks only for the last one: its acknowledgement (or the commit's error)
// arrives after every error of the batch, and ends the reading. At 10,000
// Services this halves the full sync.

// batch is a transaction as the bytes of its netlink messages, ready to
// send: BATCH_BEGIN, the operations' messages, BATCH_END. The bytes are
// kept in chunks, sent as one message vector, so a large batch is never
// copied to grow.
type batch struct {
	chunks [][]byte
	// at[i] is where message i starts: chunk index and offset; owner[i]
	// the index in tx.ops of its operation (-1 for the batch markers).
	at    []msgAt
	owner []int
	size  int
}

type msgAt struct{ chunk, off int }

const (
	nlmsgHdrLen = unix.NLMSG_HDRLEN
	chunkBytes  = 1 << 20
)

// add appends one message (header then data, padded to 4 bytes).
func (b *batch) add(typ uint16, flags uint16, data []byte, owner int) {
	n := nlmsgHdrLen + len(data)
	padded := (n + 3) &^ 3
	if len(b.chunks) == 0 || cap(b.chunks[len(b.chunks)-1])-len(b.chunks[len(b.chunks)-1]) < padded {
		b.chunks = append(b.chunks, make([]byte, 0, max(chunkBytes, padded)))
	}
	c := len(b.chunks) - 1
	buf := b.chunks[c]
	b.at, b.owner = append(b.at, msgAt{c, len(buf)}), append(b.owner, owner)
	var h [nlmsgHdrLen]byte
	binary.NativeEndian.PutUint32(h[0:], uint32(n))
	binary.NativeEndian.PutUint16(h[4:], typ)
	binary.NativeEndian.PutUint16(h[6:], flags)
	// Sequence and port ID (bytes 8-15) are set by sendBatch.
	buf = append(append(buf, h[:]...), data...)
	buf = append(buf, make([]byte, padded-n)...)
	b.chunks[c] = buf
	b.size += padded
}

func (b *batch) len() int { return len(b.at) }

// header is message i's nlmsghdr.
func (b *batch) header(i int) []byte {
	a := b.at[i]
	return b.chunks[a.chunk][a.off : a.off+nlmsgHdrLen]
}

// setSeq numbers message i.
func (b *batch) setSeq(i int, seq uint32) { binary.NativeEndian.PutUint32(b.header(i)[8:], seq) }

// encodeBatch encodes tx. It asks the kernel to acknowledge only the last
// operation's message, and to echo nothing: google/nftables asks for every
// new rule to be sent back (to learn its handle, which kp never uses),
// which cost the kernel more than adding the rules.
func (c *netlinkConn) encodeBatch(tx *Transaction) (*batch, error) {
	var captured []netlink.Message
	// Lasting: one in-memory connection for all of tx, not one per Flush.
	enc, err := nftables.New(nftables.AsLasting(), nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil { // google/nftables reading an ack: the encoder acknowledges
			return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 20)}}, nil
		}
		captured = append(captured, req...)
		return nil, nil
	}))
	if err != nil {
		return nil, err
	}
	defer func() { _ = enc.CloseLasting() }()
	nfgen := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0} // family, version, resource id (big endian)
	binary.BigEndian.PutUint16(nfgen[2:], unix.NFNL_SUBSYS_NFTABLES)
	b := &batch{}
	b.add(unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, nfgen, -1)
	last := -1
	for i := range tx.ops {
		if err := c.queue(enc, &tx.ops[i]); err != nil {
			return nil, err
		}
		captured = captured[:0]
		if err := enc.Flush(); err != nil {
			return nil, fmt.Errorf("encode %s: %w", tx.ops[i].describe(), err)
		}
		// Flush wrapped the operation's messages in a batch of their own.
		for _, m := range captured {
			if t := uint16(m.Header.Type); t == unix.NFNL_MSG_BATCH_BEGIN || t == unix.NFNL_MSG_BATCH_END {
				continue
			}
			flags := uint16(m.Header.Flags &^ (netlink.Acknowledge | netlink.Echo))
			last = b.len()
			b.add(uint16(m.Header.Type), flags, m.Data, i)
		}
	}
	if last >= 0 {
		h := b.header(last)
		binary.NativeEndian.PutUint16(h[6:], binary.NativeEndian.Uint16(h[6:])|unix.NLM_F_ACK)
	}
	b.add(unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, nfgen, -1)
	return b, nil
}

// batchSocket is the netlink socket transactions go through. It stays
// open: closing a netfilter netlink socket makes the kernel wait for the
// release of the previous transaction's objects (an RCU grace period,
// about 15 ms here), which would double the time of a small sync.
func (c *netlinkConn) batchSocket() (*netlink.Conn, error) {
	if c.batch != nil {
		return c.batch, nil
	}
	cfg := &netlink.Config{}
	if c.nsFd > 0 {
		cfg.NetNS = c.nsFd
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	// Errors come back with the failing message's header only, and the
	// kernel's explanation when it has one.
	_ = conn.SetOption(netlink.CapAcknowledge, true)
	_ = conn.SetOption(netlink.ExtendedAcknowledge, true)
	c.batch = conn
	return conn, nil
}

// dropBatchSocket closes the socket after a failure, so that nothing the
// kernel still sends for a batch kp gave up on is read as the next one's.
func (c *netlinkConn) dropBatchSocket() {
	if c.batch != nil {
		_ = c.batch.Close()
		c.batch = nil
	}
}

// sendBatch sends msgs in one sendmsg and reads the kernel's answer: every
// failing message's error, then the acknowledgement of the last message
// (encodeBatch asks for that one only).
func (c *netlinkConn) sendBatch(tx *Transaction, b *batch) (err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, err := c.batchSocket()
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			c.dropBatchSocket()
		}
	}()
	if err := batchBuffers(len(tx.ops))(conn); err != nil {
		return err
	}
	first := c.seq + 1
	for i := range b.len() {
		c.seq++
		b.setSeq(i, c.seq)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgBuffers(int(fd), b.chunks, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return fmt.Errorf("send %d messages: %w", b.len(), err)
	}
	if serr != nil {
		return fmt.Errorf("send %d messages (%d bytes): %w", b.len(), b.size, serr)
	}
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	last := first + uint32(b.len()) - 2 // the last operation's message
	buf := make([]byte, 64<<10)
	var errs []error
	for {
		var n int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return fmt.Errorf("read the kernel's answer: %w", err)
		}
		if rerr != nil {
			return fmt.Errorf("read the kernel's answer: %w", rerr)
		}
		replies, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("parse the kernel's answer: %w", err)
		}
		for _, m := range replies {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4+unix.NLMSG_HDRLEN {
				continue
			}
			code := -int32(binary.NativeEndian.Uint32(m.Data[:4]))
			seq := binary.NativeEndian.Uint32(m.Data[4+8:])
			if seq < first || seq > last {
				continue // not this batch's
			}
			if code != 0 {
				errs = append(errs, batchError(tx, b.owner, int(seq-first), syscall.Errno(code), extAckMessage(m)))
			}
			if seq == last {
				return errors.Join(errs...)
			}
		}
	}
}

// batchError names the operation that failed: which chain, set, rule or
// element the kernel refused, not only why.
func batchError(tx *Transaction, owner []int, i int, errno syscall.Errno, why string) error {
	what := "the transaction"
	if i >= 0 && i < len(owner) && owner[i] >= 0 {
		what = fmt.Sprintf("operation %d of %d (%s)", owner[i]+1, len(tx.ops), tx.ops[owner[i]].describe())
	}
	if why != "" {
		return fmt.Errorf("%s: %w: %s", what, errno, why)
	}
	return fmt.Errorf("%s: %w", what, errno)
}

// extAckMessage is the kernel's text in an error message's extended
// acknowledgement (NLMSGERR_ATTR_MSG), if any.
func extAckMessage(m syscall.NetlinkMessage) string {
	const flagAckTLVs, attrMsg = 0x200, 1
	if m.Header.Flags&flagAckTLVs == 0 {
		return ""
	}
	b := m.Data[4+unix.NLMSG_HDRLEN:] // errno, then the capped header
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		if l < 4 || l > len(b) {
			break
		}
		if binary.NativeEndian.Uint16(b[2:])&0x3fff == attrMsg {
			return strings.TrimRight(string(b[4:l]), "\x00")
		}
		next := (l + 3) &^ 3
		if next > len(b) {
			break
		}
		b = b[next:]
	}
	return ""
}
