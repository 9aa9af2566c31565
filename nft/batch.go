package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// google/nftables serializes kp's operations, but kp sends them itself.
// Its Flush asks the kernel to acknowledge every message and reads the
// acknowledgements one recvmsg at a time, each into a fresh page: a full
// sync has hundreds of thousands of messages, and reading their acks cost
// more than building the transaction (test/bench/NOTES.md). The kernel
// reports a failing message whether or not it was asked to acknowledge it,
// so kp asks only for the last one: its acknowledgement (or the commit's
// error) arrives after every error of the batch, and ends the reading.

// batch is a transaction as the bytes of its netlink messages, ready to
// send: BATCH_BEGIN, the operations' messages, BATCH_END. The bytes are
// kept in chunks, sent as one message vector, so a large batch is never
// copied to grow.
type batch struct {
	chunks [][]byte
	// at[i] is where message i starts: chunk index and offset; owner[i]
	// the index in notes of its operation (-1 for the batch markers).
	at    []msgAt
	owner []int
	notes []opNote
	size  int
}

type msgAt struct{ chunk, off int }

const (
	nlmsgHdrLen = unix.NLMSG_HDRLEN
	// Chunks start small and double up to chunkBytes: a partial sync's
	// batch is a few KiB, and a first chunk of a MiB for each was most of
	// the garbage an endpoint change made (test/bench/NOTES.md).
	firstChunkBytes = 16 << 10
	chunkBytes      = 1 << 20
)

// add appends one message (header then data, padded to 4 bytes).
func (b *batch) add(typ uint16, flags uint16, data []byte, owner int) {
	n := nlmsgHdrLen + len(data)
	padded := (n + 3) &^ 3
	if len(b.chunks) == 0 || cap(b.chunks[len(b.chunks)-1])-len(b.chunks[len(b.chunks)-1]) < padded {
		size := firstChunkBytes
		if k := len(b.chunks); k > 0 {
			size = min(chunkBytes, 2*cap(b.chunks[k-1]))
		}
		b.chunks = append(b.chunks, make([]byte, 0, max(size, padded)))
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
	buf = append(buf, make([]byte, 4)[:padded-n]...)
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

// batchEncoder encodes operations into a batch as they come, so that a
// full sync holds each Service's rendered rules only until they are encoded
// (see Transaction.spill). It asks the kernel to acknowledge only the last
// operation's message, and to echo nothing: google/nftables asks for every
// new rule to be sent back (to learn its handle, which kp never uses),
// which cost the kernel more than adding the rules.
type batchEncoder struct {
	enc      *nftables.Conn
	captured []netlink.Message
	b        *batch
	last     int // the last operation message, -1 before the first
	nfgen    []byte
	scratch  []byte // an element message being written (element_encoding.go)
}

func newBatchEncoder() (*batchEncoder, error) {
	e := &batchEncoder{b: &batch{}, last: -1}
	var err error
	// Lasting: one in-memory connection for all of the batch, not one per Flush.
	e.enc, err = nftables.New(nftables.AsLasting(), nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil { // google/nftables reading an ack: the encoder acknowledges
			return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 20)}}, nil
		}
		e.captured = append(e.captured, req...)
		return nil, nil
	}))
	if err != nil {
		return nil, err
	}
	e.nfgen = []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0} // family, version, resource id (big endian)
	binary.BigEndian.PutUint16(e.nfgen[2:], unix.NFNL_SUBSYS_NFTABLES)
	e.b.add(unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, e.nfgen, -1)
	return e, nil
}

// add encodes one operation.
func (e *batchEncoder) add(o *op) error {
	if o.kind == opAddElement || o.kind == opDelElement {
		e.addElements(o)
		return nil
	}
	if err := queue(e.enc, o); err != nil {
		return err
	}
	e.captured = e.captured[:0]
	if err := e.enc.Flush(); err != nil {
		return fmt.Errorf("encode %s: %w", o.describe(), err)
	}
	note := len(e.b.notes)
	e.b.notes = append(e.b.notes, noteOf(o))
	// Flush wrapped the operation's messages in a batch of their own.
	for _, m := range e.captured {
		if t := uint16(m.Header.Type); t == unix.NFNL_MSG_BATCH_BEGIN || t == unix.NFNL_MSG_BATCH_END {
			continue
		}
		flags := uint16(m.Header.Flags &^ (netlink.Acknowledge | netlink.Echo))
		data := m.Data
		if o.kind == opAddSet && o.set.DataHostOrder {
			data = withSetUserdata(data, userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_DATABYTEORDER, 1))
		}
		e.last = e.b.len()
		e.b.add(uint16(m.Header.Type), flags, data, note)
	}
	clear(e.captured) // the messages' data, until the next operation
	return nil
}

// finish ends the batch and returns it; the encoder is done.
func (e *batchEncoder) finish() *batch {
	if e.last >= 0 {
		h := e.b.header(e.last)
		binary.NativeEndian.PutUint16(h[6:], binary.NativeEndian.Uint16(h[6:])|unix.NLM_F_ACK)
	}
	e.b.add(unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, e.nfgen, -1)
	e.close()
	return e.b
}

// empty reports whether no operation was encoded.
func (e *batchEncoder) empty() bool { return len(e.b.notes) == 0 }

func (e *batchEncoder) close() {
	if e.enc != nil {
		_ = e.enc.CloseLasting()
		e.enc = nil
	}
}

// encodeBatch encodes a whole transaction (one that was not streamed).
func encodeBatch(tx *Transaction) (*batch, error) {
	e, err := newBatchEncoder()
	if err != nil {
		return nil, err
	}
	defer e.close()
	for i := range tx.ops {
		if err := e.add(&tx.ops[i]); err != nil {
			return nil, err
		}
	}
	return e.finish(), nil
}

// opNote is what an error message needs of an operation once the
// operation itself is gone (a streamed batch drops each Service's rules as
// soon as they are encoded): a few words per operation, sharing the
// rendered names and texts.
type opNote struct {
	kind     opKind
	v6, vmap bool
	elems    int32
	name     string // the chain's, the set's or the counter's
	text     string // a rule's text, or the first element's key
	value    string // the first element's value
}

func noteOf(o *op) opNote {
	n := opNote{kind: o.kind, v6: o.fam.v6, name: o.name, elems: int32(len(o.elems))}
	switch {
	case o.rule != nil:
		n.name, n.text = o.chain.Name, o.rule.Text
	case o.chain != nil:
		n.name = o.chain.Name
	case o.set != nil:
		n.name, n.vmap = o.set.Name, o.set.VMap
	}
	if len(o.elems) > 0 {
		e := &o.elems[0]
		n.text, n.value = e.KeyText, e.DataText
		if n.value == "" {
			n.value = e.value()
		}
	}
	return n
}

// describe is the noted operation's first line in nft syntax.
func (n *opNote) describe() string {
	o := op{kind: n.kind, fam: familyIPv4, name: n.name, chain: &Chain{Name: n.name},
		set: &Set{Name: n.name, VMap: n.vmap}, rule: &Rule{Text: n.text}}
	if n.v6 {
		o.fam = familyIPv6
	}
	if n.elems > 0 {
		o.elems = make([]Element, n.elems)
		o.elems[0] = Element{KeyText: n.text, DataText: n.value}
	}
	return o.describe()
}

// batchSocket is the netlink socket transactions go through. It stays
// open: closing a netfilter netlink socket makes the kernel wait for the
// release of the previous transaction's objects (an RCU grace period),
// which would double the time of a small sync (test/bench/NOTES.md).
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
	id, err := portID(conn)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	c.own.add(id)
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
//
// The whole batch goes in one sendmsg: nfnetlink reads a batch from one
// message buffer (skb), and one that ends without its BATCH_END message is
// aborted whole, silently; the next sendmsg's messages, outside any batch,
// are refused (TestKernelBatchSplitOverTwoSendsAppliesNothing). kp can
// encode a full sync Service by Service, but the encoded batch is sent,
// and so held, whole.
func (c *netlinkConn) sendBatch(b *batch) (err error) {
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
	if err := batchBuffers(b.len(), b.size)(conn); err != nil {
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
				errs = append(errs, b.errorAt(int(seq-first), syscall.Errno(code), extAckMessage(m)))
			}
			if seq == last {
				return errors.Join(errs...)
			}
		}
	}
}

// batchError names the operation that failed: which chain, set, rule or
// element the kernel refused, not only why.
func (b *batch) errorAt(i int, errno syscall.Errno, why string) error {
	what := "the transaction"
	if i >= 0 && i < len(b.owner) && b.owner[i] >= 0 {
		what = fmt.Sprintf("operation %d of %d (%s)", b.owner[i]+1, len(b.notes), b.notes[b.owner[i]].describe())
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

// withSetUserdata is a NEWSET message's data (the nfgenmsg header, then
// attributes) with ud appended to its user data, which google/nftables
// cannot be asked for: nft reads the byte order of a map's data there
// (NFTNL_UDATA_SET_DATABYTEORDER), as it reads the key's.
func withSetUserdata(data, ud []byte) []byte {
	const hdr = 4 // struct nlattr: length, type
	out := append([]byte{}, data[:4]...)
	found := false
	for rest := data[4:]; len(rest) >= hdr; {
		n := int(binary.NativeEndian.Uint16(rest))
		if n < hdr || n > len(rest) {
			return data // not attributes as expected: unchanged
		}
		typ := binary.NativeEndian.Uint16(rest[2:])
		value := rest[hdr:n]
		if typ == unix.NFTA_SET_USERDATA {
			found = true
			value = append(append([]byte{}, value...), ud...)
		}
		out = appendAttr(out, typ, value...)
		rest = rest[min(len(rest), (n+3)&^3):]
	}
	if !found {
		out = appendAttr(out, unix.NFTA_SET_USERDATA, ud...)
	}
	return out
}
