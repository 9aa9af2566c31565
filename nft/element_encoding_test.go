package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// googleElementMessages is how google/nftables encodes o (kp's encoding
// before element_encoding.go): the data of each message, one per run of
// elementChunkEnd.
func googleElementMessages(t *testing.T, o *op) [][]byte {
	t.Helper()
	var captured []netlink.Message
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil {
			return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 20)}}, nil
		}
		captured = append(captured, req...)
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseLasting()
	s := nfSet(nfTable(o.fam), o.set)
	send := conn.SetDeleteElements
	if o.kind == opAddElement {
		send = conn.SetAddElements
	}
	for start := 0; start < len(o.elems); {
		end := elementChunkEnd(o, start)
		var elems []nftables.SetElement
		for _, e := range o.elems[start:end] {
			el := nftables.SetElement{Key: e.Key, IntervalEnd: e.KeyEnd, Comment: e.Comment}
			if o.kind == opAddElement {
				switch e.Verdict {
				case verdictDrop:
					el.VerdictData = &expr.Verdict{Kind: expr.VerdictDrop}
				case verdictGoto:
					el.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: e.Chain}
				case verdictJump:
					el.VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: e.Chain}
				default:
					el.Val = e.Data
				}
			}
			elems = append(elems, el)
		}
		if err := send(s, elems); err != nil {
			t.Fatal(err)
		}
		start = end
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, m := range captured[1 : len(captured)-1] { // within BATCH_BEGIN and BATCH_END
		out = append(out, m.Data)
	}
	return out
}

func TestElementMessagesAreGoogleNftablesBytes(t *testing.T) {
	many := func(n int, mk func(i int) Element) []Element {
		var es []Element
		for i := range n {
			es = append(es, mk(i))
		}
		return es
	}
	v4 := func(i int) []byte { return []byte{10, 96, byte(i >> 8), byte(i)} }
	cases := []struct {
		name string
		o    op
	}{
		{"verdict map: jump, goto and drop, with comments", op{kind: opAddElement, fam: familyIPv4,
			set: &Set{Name: mapServiceIPs, VMap: true}, elems: []Element{
				{Key: append(v4(1), 6, 0, 0, 0, 0, 80, 0, 0), Verdict: verdictJump, Chain: "pick-svc-demo/web/tcp/http", Comment: "demo/web:http"},
				{Key: append(v4(2), 17, 0, 0, 0, 0, 53, 0, 0), Verdict: verdictGoto, Chain: "svc-demo/dns/udp/dns"},
				{Key: append(v4(3), 6, 0, 0, 0, 1, 187, 0, 0), Verdict: verdictDrop, Comment: "odd length comment"},
			}}},
		{"data map", op{kind: opAddElement, fam: familyIPv4, set: &Set{Name: mapEndpoints}, elems: many(5, func(i int) Element {
			return Element{Key: slotKey(uint32(i + 7)), Data: append(v4(i), 0x1f, 0x90, 0, 0), Comment: fmt.Sprintf("ns/svc%d", i)}
		})}},
		{"interval set with end flags", op{kind: opAddElement, fam: familyIPv4, set: &Set{Name: setServiceCIDRs, Interval: true},
			elems: []Element{{Key: []byte{10, 96, 0, 0}}, {Key: []byte{10, 97, 0, 0}, KeyEnd: true}}}},
		{"IPv6 concatenation set, deleted", op{kind: opDelElement, fam: familyIPv6, set: &Set{Name: setHairpin, Concat: true},
			elems: []Element{{Key: bytes.Repeat([]byte{0xfd, 0, 0, 1}, 8), Comment: "x"}}}},
		{"deleted verdicts carry no verdict", op{kind: opDelElement, fam: familyIPv4, set: &Set{Name: mapServiceIPs, VMap: true},
			elems: []Element{{Key: append(v4(1), 6, 0, 0, 0, 0, 80, 0, 0), Verdict: verdictJump, Chain: "pick-x"}}}},
		{"a list over maxElementBytes goes in several messages", op{kind: opAddElement, fam: familyIPv4,
			set: &Set{Name: mapServiceIPs, VMap: true}, elems: many(1500, func(i int) Element {
				return Element{Key: append(v4(i), 6, 0, 0, 0, 0, 80, 0, 0), Verdict: verdictJump,
					Chain: fmt.Sprintf("pick-svc-ns/svc%d/tcp/p", i), Comment: fmt.Sprintf("ns/svc%d:p", i)}
			})}},
	}
	for _, c := range cases {
		want := googleElementMessages(t, &c.o)
		e, err := newBatchEncoder()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.add(&c.o); err != nil {
			t.Fatal(err)
		}
		b := e.finish()
		got := b.len() - 2 // within BATCH_BEGIN and BATCH_END
		if got != len(want) {
			t.Errorf("%s: %d messages, google/nftables writes %d", c.name, got, len(want))
			continue
		}
		if c.name == "a list over maxElementBytes goes in several messages" && got < 2 {
			t.Errorf("%s: one message", c.name)
		}
		for i := range want {
			a := b.at[i+1]
			h := b.header(i + 1)
			n := int(binary.NativeEndian.Uint32(h[0:4]))
			data := b.chunks[a.chunk][a.off+nlmsgHdrLen : a.off+n]
			if !bytes.Equal(data, want[i]) {
				t.Errorf("%s: message %d differs from google/nftables's:\n got %x\nwant %x", c.name, i, data, want[i])
			}
			typ, flags := binary.NativeEndian.Uint16(h[4:]), binary.NativeEndian.Uint16(h[6:])
			wantTyp := uint16(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELSETELEM)
			if c.o.kind == opAddElement {
				wantTyp = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM
			}
			wantFlags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_CREATE)
			if i == len(want)-1 {
				wantFlags |= unix.NLM_F_ACK // the batch's last operation message
			}
			if typ != wantTyp || flags != wantFlags {
				t.Errorf("%s: message %d has type %#x and flags %#x, want %#x and %#x", c.name, i, typ, flags, wantTyp, wantFlags)
			}
		}
	}
}

// A streamed transaction hands the element lists the encoder is done with
// to the next diff, and the batch is what it would be with fresh lists.
func TestSpilledElementListsAreReusedAfterEncoding(t *testing.T) {
	set := &Set{Name: mapEndpoints}
	group := func(first int) []Element {
		var es []Element
		for i := range 4 {
			es = append(es, Element{Key: slotKey(uint32(first + i)), Data: []byte{10, 0, 0, byte(first + i), 0x1f, 0x90, 0, 0}})
		}
		return es
	}
	encode := func(reuse bool) (*batch, bool) {
		e, err := newBatchEncoder()
		if err != nil {
			t.Fatal(err)
		}
		tx := &Transaction{stream: e}
		first := tx.elementsFor(4)
		tx.addElements(familyIPv4, set, append(first, group(0)...))
		if err := tx.spill(); err != nil {
			t.Fatal(err)
		}
		second := make([]Element, 0, 4)
		reused := false
		if reuse {
			second = tx.elementsFor(4)
			reused = cap(second) >= 4 && &second[:1][0] == &first[:1][0]
			if len(second) != 0 || !slices.EqualFunc(second[:4], make([]Element, 4), func(a, b Element) bool { return a.Key == nil && a.Data == nil }) {
				t.Errorf("a spare list is not empty and cleared: %v", second[:4])
			}
		}
		tx.addElements(familyIPv4, set, append(second, group(4)...))
		if err := tx.spill(); err != nil {
			t.Fatal(err)
		}
		return e.finish(), reused
	}
	fresh, _ := encode(false)
	again, reused := encode(true)
	if !reused {
		t.Error("the second group's list is not the first's, encoded")
	}
	if !slices.EqualFunc(fresh.chunks, again.chunks, bytes.Equal) {
		t.Errorf("the batch differs with a reused list:\n%x\n%x", again.chunks, fresh.chunks)
	}
}
