package netns

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// The kernel's own count of a lost SYN: in a namespace whose nftables table
// drops SYNs to the echo port for 1.5 s, an attempt made then connects
// after the kernel sent its SYN again, and Loop says so by that count —
// with a latency bound loose enough (5 s, looser than the VM needs) that
// the latency alone would not have failed it. Quick attempts before and
// after count none.
func TestLoopCountsARetransmittedSYNWhateverTheLatencyBound(t *testing.T) {
	Require(t, "nft")
	ns := NewNamespace(t, "synloss")
	Serve(t, ns, "127.0.0.1:9999", func(c net.Conn) { fmt.Fprintf(c, "lo %s\n", c.RemoteAddr()) })
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return DialConn(ctx, ns, network, addr)
	}
	spec := LoopSpec{Dial: dial, Addrs: []string{"127.0.0.1:9999"}, Timeout: 8 * time.Second, Slow: 5 * time.Second}

	quick := StartLoop(spec)
	time.Sleep(200 * time.Millisecond)
	if s := quick.Stop(); len(s.Failures) > 0 || len(s.Attempts) == 0 {
		t.Fatalf("before the drop: %d attempts, failures %v", len(s.Attempts), s.Failures)
	}

	if out, err := Exec(ns, "nft", "add table inet synloss; add chain inet synloss in { type filter hook input priority 0; }; "+
		"add rule inet synloss in tcp dport 9999 tcp flags syn drop"); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	go func() {
		time.Sleep(1500 * time.Millisecond)
		_, _ = Exec(ns, "nft", "delete table inet synloss")
	}()
	l := StartLoop(spec)
	time.Sleep(2500 * time.Millisecond)
	s := l.Stop()
	if len(s.Failures) == 0 || !strings.Contains(s.Failures[0], "its SYN was sent") {
		t.Fatalf("a SYN dropped for 1.5 s with a 5 s latency bound: failures %v, want the kernel's retransmission count named", s.Failures)
	}
	if s.Attempts[0].SYNRetransmits == 0 || s.Attempts[0].Latency() > spec.Slow {
		t.Errorf("first attempt: %d SYN retransmissions after %v: want ≥ 1 within the 5 s bound (the count, not the latency, failed it)",
			s.Attempts[0].SYNRetransmits, s.Attempts[0].Latency())
	}
}
