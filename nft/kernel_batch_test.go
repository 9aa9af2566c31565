package nft

import (
	"encoding/binary"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestKernelBatchSplitOverTwoSendsAppliesNothing: nfnetlink reads a batch
// from one sendmsg. A batch whose BATCH_END comes in a second sendmsg is
// aborted whole, without an error for its first part, and the second
// part's messages, outside any batch, are refused. So kp sends every batch
// in one sendmsg, however it was encoded.
func TestKernelBatchSplitOverTwoSendsAppliesNothing(t *testing.T) {
	ns, fd := testNetns(t)
	c := &netlinkConn{nsFd: fd}
	f := families[0]
	tx := &Transaction{}
	tx.addTable(f)
	tx.addChain(f, &Chain{Name: "first"})
	tx.addChain(f, &Chain{Name: "second"})
	b, err := encodeBatch(tx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.batchSocket()
	if err != nil {
		t.Fatal(err)
	}
	defer c.dropBatchSocket()
	for i := range b.len() {
		b.setSeq(i, uint32(1000+i))
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// BEGIN, add table, add chain first | add chain second, END.
	if len(b.chunks) != 1 || b.len() != 5 {
		t.Fatalf("want 5 messages in one chunk, have %d in %d", b.len(), len(b.chunks))
	}
	split := b.at[3].off
	for _, part := range [][]byte{b.chunks[0][:split], b.chunks[0][split:]} {
		var serr error
		if err := raw.Write(func(fd uintptr) bool {
			_, serr = unix.SendmsgBuffers(int(fd), [][]byte{part}, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
			return serr != unix.EAGAIN
		}); err != nil || serr != nil {
			t.Fatalf("sendmsg: %v %v", err, serr)
		}
	}
	var errs []string
	buf := make([]byte, 64<<10)
	for {
		var n int
		var rerr error
		_ = raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			return true
		})
		if rerr != nil || n <= 0 {
			break
		}
		msgs, err := parseErrors(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		errs = append(errs, msgs...)
	}
	t.Logf("the kernel answered: %v", errs)
	if len(errs) == 0 {
		t.Errorf("the second sendmsg's messages were not refused")
	}
	if out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), TableName) {
		t.Errorf("a batch split over two sendmsg calls applied its first part:\n%s", out)
	}
}

// parseErrors lists the error messages in a netlink answer as "seq: errno".
func parseErrors(b []byte) ([]string, error) {
	var out []string
	for len(b) >= unix.NLMSG_HDRLEN {
		n, typ := int(binary.NativeEndian.Uint32(b)), binary.NativeEndian.Uint16(b[4:])
		if n < unix.NLMSG_HDRLEN || n > len(b) {
			return nil, fmt.Errorf("bad netlink message length %d", n)
		}
		if typ == unix.NLMSG_ERROR && n >= unix.NLMSG_HDRLEN+4+unix.NLMSG_HDRLEN {
			code := -int32(binary.NativeEndian.Uint32(b[unix.NLMSG_HDRLEN:]))
			seq := binary.NativeEndian.Uint32(b[unix.NLMSG_HDRLEN+4+8:])
			if code != 0 {
				out = append(out, fmt.Sprintf("%d: %v", seq, unix.Errno(code)))
			}
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return out, nil
}

// TestKernelStreamedFullSyncIsOneTransaction: a full sync is encoded
// Service by Service, and still applied all or nothing. A streamed
// transaction whose last operation the kernel refuses leaves nothing of
// the Services encoded before it.
func TestKernelStreamedFullSyncIsOneTransaction(t *testing.T) {
	ns, fd := testNetns(t)
	c := &netlinkConn{nsFd: fd}
	tx, err := c.Stream()
	if err != nil {
		t.Fatal(err)
	}
	f := families[0]
	tx.addTable(f)
	for i := range 2000 { // several chunks of the encoded batch
		ch := &Chain{Name: fmt.Sprintf("svc-%d", i), Rules: []Rule{newRule(f).counter().build("")}}
		tx.addChain(f, ch)
		tx.addRule(f, ch, &ch.Rules[0])
		if err := tx.spill(); err != nil {
			t.Fatal(err)
		}
	}
	if len(tx.ops) != 0 || tx.Len() != 4001 {
		t.Fatalf("spilled transaction holds %d operations (of %d), want none", len(tx.ops), tx.Len())
	}
	tx.addRule(f, &Chain{Name: "missing"}, &Rule{Text: "accept"})
	err = c.Apply(tx)
	if err == nil {
		t.Fatal("the kernel accepted a rule in a chain that does not exist")
	}
	if !strings.Contains(err.Error(), "operation 4002 of 4002 (add rule ip kp missing accept)") {
		t.Errorf("error %q does not name the refused operation", err)
	}
	if out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), TableName) {
		t.Errorf("a refused streamed batch left part of itself behind:\n%s", out)
	}
}
