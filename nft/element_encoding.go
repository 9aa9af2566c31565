package nft

// Set elements are most of a full sync's batch (ten endpoint slots and
// hairpin pods for each Service's verdict), and google/nftables builds
// each one as a slice of netlink attributes, each marshalled into a fresh
// buffer and copied into its parent's: the largest part of what a full
// sync allocated (test/bench/NOTES.md). kp writes their messages itself,
// straight into one reused buffer, as the same bytes
// (TestElementMessagesAreGoogleNftablesBytes).

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

const (
	nlaNested   = unix.NLA_F_NESTED
	elemComment = 0 // NFTNL_UDATA_SET_ELEM_COMMENT
)

// addElements encodes an element operation as one NEWSETELEM or DELSETELEM
// message per run of elementChunks, with the flags the batch gives every
// operation (a request that creates; no acknowledgement, see batchEncoder).
func (e *batchEncoder) addElements(o *op) {
	typ := uint16(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELSETELEM)
	if o.kind == opAddElement {
		typ = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM
	}
	note := len(e.b.notes)
	e.b.notes = append(e.b.notes, noteOf(o))
	for start := 0; start < len(o.elems); {
		end := elementChunkEnd(o, start)
		e.scratch = appendElementMessage(e.scratch[:0], o, o.elems[start:end])
		e.last = e.b.len()
		e.b.add(typ, unix.NLM_F_REQUEST|unix.NLM_F_CREATE, e.scratch, note)
		start = end
	}
}

// elementChunkEnd is where the run of o's elements that starts at start
// ends: its estimated encoding stays under maxElementBytes (the elements'
// list is one attribute, whose length is 16 bits).
func elementChunkEnd(o *op, start int) int {
	size := 0
	for i := start; i < len(o.elems); i++ {
		el := &o.elems[i]
		// Attribute headers and padding, flags, key, verdict and
		// comment: 64 bytes covers every fixed part.
		n := 64 + len(el.Key) + len(el.Comment)
		if o.kind == opAddElement {
			if el.Verdict == verdictGoto || el.Verdict == verdictJump {
				n += len(el.Chain)
			} else if el.Verdict == verdictNone {
				n += len(el.Data)
			}
		}
		if size+n > maxElementBytes && i > start {
			return i
		}
		size += n
	}
	return len(o.elems)
}

// appendElementMessage appends the data of one element message (after its
// nlmsghdr): the nfgenmsg, the set, its table and the elements.
func appendElementMessage(b []byte, o *op, elems []Element) []byte {
	b = append(b, byte(o.fam.nf), unix.NFNETLINK_V0, 0, 0)
	b = appendStringAttr(b, unix.NFTA_SET_NAME, o.set.Name)
	b = appendAttr(b, unix.NFTA_LOOKUP_SET_ID, 0, 0, 0, 0) // kp names its sets; no transaction ID
	b = appendStringAttr(b, unix.NFTA_SET_TABLE, TableName)
	list := len(b)
	b = beginNested(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	for i := range elems {
		el := &elems[i]
		item := len(b)
		b = beginNested(b, uint16(i+1))
		if el.KeyEnd {
			// google/nftables flags this attribute nested; the kernel
			// reads it either way.
			b = appendAttr(b, unix.NFTA_SET_ELEM_FLAGS|nlaNested, 0, 0, 0, unix.NFT_SET_ELEM_INTERVAL_END)
		}
		key := len(b)
		b = beginNested(b, unix.NFTA_SET_ELEM_KEY)
		b = appendAttr(b, unix.NFTA_DATA_VALUE, el.Key...)
		b = endNested(b, key)
		if o.kind == opAddElement {
			b = appendElementData(b, el)
		}
		if el.Comment != "" {
			b = appendCommentAttr(b, el.Comment)
		}
		b = endNested(b, item)
	}
	return endNested(b, list)
}

// appendElementData appends a map element's value: a verdict (code and
// chain, nested twice as google/nftables nests them) or data.
func appendElementData(b []byte, el *Element) []byte {
	var code expr.VerdictKind
	switch el.Verdict {
	case verdictNone:
		if len(el.Data) == 0 {
			return b // a set's element
		}
		data := len(b)
		b = beginNested(b, unix.NFTA_SET_ELEM_DATA)
		b = appendAttr(b, unix.NFTA_DATA_VALUE, el.Data...)
		return endNested(b, data)
	case verdictDrop:
		code = expr.VerdictDrop
	case verdictGoto:
		code = expr.VerdictGoto
	case verdictJump:
		code = expr.VerdictJump
	}
	outer := len(b)
	b = beginNested(b, unix.NFTA_SET_ELEM_DATA)
	inner := len(b)
	b = beginNested(b, unix.NFTA_DATA_VERDICT)
	var c [4]byte
	binary.BigEndian.PutUint32(c[:], uint32(code))
	b = appendAttr(b, unix.NFTA_VERDICT_CODE, c[:]...)
	if el.Verdict != verdictDrop {
		b = appendStringAttr(b, unix.NFTA_VERDICT_CHAIN, el.Chain)
	}
	b = endNested(b, inner)
	return endNested(b, outer)
}

// appendCommentAttr appends the element's comment as nft keeps it: user
// data of one TLV, the comment NUL-terminated.
func appendCommentAttr(b []byte, comment string) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0, elemComment, byte(len(comment)+1))
	b = append(append(b, comment...), 0)
	return endAttr(b, at, unix.NFTA_SET_ELEM_USERDATA)
}

// appendAttr appends a netlink attribute (native-endian length and type,
// the data, zeros to a multiple of 4 bytes).
func appendAttr(b []byte, typ uint16, data ...byte) []byte {
	at := len(b)
	b = append(append(b, 0, 0, 0, 0), data...)
	return endAttr(b, at, typ)
}

// appendStringAttr appends a NUL-terminated string attribute.
func appendStringAttr(b []byte, typ uint16, s string) []byte {
	at := len(b)
	b = append(append(append(b, 0, 0, 0, 0), s...), 0)
	return endAttr(b, at, typ)
}

// endAttr writes the header of the attribute that starts at at and pads it.
func endAttr(b []byte, at int, typ uint16) []byte {
	binary.NativeEndian.PutUint16(b[at:], uint16(len(b)-at))
	binary.NativeEndian.PutUint16(b[at+2:], typ)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// beginNested starts a nested attribute; endNested, given where it began,
// writes its length (its children are padded already).
func beginNested(b []byte, typ uint16) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(b[at+2:], typ|nlaNested)
	return b
}

func endNested(b []byte, at int) []byte {
	binary.NativeEndian.PutUint16(b[at:], uint16(len(b)-at))
	return b
}
