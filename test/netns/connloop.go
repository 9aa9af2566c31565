package netns

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SlowConnect is how long a new connection may take to be answered before
// it counts as failed although it got through. Linux sends a SYN again 1 s
// after it went unanswered (its initial retransmission timeout), so an
// attempt answered after more than this lost its first SYN — to a moment
// without rules, say — and only a timeout longer than 1 s hid that.
const SlowConnect = 900 * time.Millisecond

// Attempt is one new connection of a Loop.
type Attempt struct {
	At   time.Time
	Addr string
	// Connect is how long the handshake took (to succeed or fail); Answer
	// how long until the echo server's reply line was read, the handshake
	// included (0 without a reply). Answer is the one bounded: through a
	// proxy that accepts the client itself (userspace), the SYN to the
	// endpoint goes out after the client's handshake.
	Connect, Answer time.Duration
	// SYNRetransmits is how many times the client's kernel sent the SYN
	// again (TCP_INFO's retransmission count read right after the
	// handshake, when only the SYN can have been sent twice): a lost SYN
	// is one sent again after synRTOInit, whatever the latency bound, so a
	// loaded machine or the VM's emulation may slow an attempt without
	// hiding one. Through a proxy
	// that accepts the client itself (userspace) it stays 0 and only the
	// latency bound speaks.
	SYNRetransmits uint32
	Reply          string // the reply line, "pod-1 10.0.2.2:40312"
	Err            error  // the attempt's error, or what the loop's Check said of its reply
	Seen           string // what LoopSpec.Explain saw right after a failed or slow attempt
}

// Latency is how long the attempt waited: until its answer, or until it
// failed.
func (a Attempt) Latency() time.Duration {
	if a.Answer > 0 {
		return a.Answer
	}
	return a.Connect
}

// Failure says why the attempt failed, "" if it did not: an error, or an
// answer slower than bound (a SYN sent again).
func (a Attempt) Failure(bound time.Duration) string {
	at := a.At.Format("15:04:05.000")
	switch {
	case a.Err != nil:
		return fmt.Sprintf("%s %s: %v (after %v)%s", at, a.Addr, a.Err, a.Latency().Round(time.Millisecond), a.Seen)
	case a.SYNRetransmits > 0 && a.Connect >= synRTOInit:
		return fmt.Sprintf("%s %s: its SYN was sent %d more time(s) (the kernel's count; connected after %v)%s",
			at, a.Addr, a.SYNRetransmits, a.Connect.Round(time.Millisecond), a.Seen)
	case a.Latency() > bound:
		return fmt.Sprintf("%s %s: slow, answered after %v (connected after %v), over %v: a SYN was sent again%s",
			at, a.Addr, a.Latency().Round(time.Millisecond), a.Connect.Round(time.Millisecond), bound, a.Seen)
	}
	return ""
}

// synRTOInit is Linux's first SYN retransmission timeout (TCP_TIMEOUT_INIT):
// a lost SYN is sent again only this long after the first. A SYN counted
// as sent again sooner was not lost: the client sends it again at once when
// the peer answers with an ACK from a TIME_WAIT of the same four-tuple (a
// reused source port; the endpoint's PAWS check), which happens without any
// switch (about 1 in 1,700 connections, test/proofs/t32a.md).
const synRTOInit = time.Second

// LoopSpec is what a Loop does.
type LoopSpec struct {
	// Dial opens one new connection to addr, from the client's namespace.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Addrs are the echo servers' addresses, taken in turn.
	Addrs []string
	// Timeout bounds one attempt. It should be well over Slow, so that a
	// slow attempt is measured rather than cut short.
	Timeout time.Duration
	// Pause is the wait between one attempt's end and the next's start.
	Pause time.Duration
	// Slow bounds an attempt's latency (SlowConnect when 0).
	Slow time.Duration
	// Check, when set, turns an answer the test does not expect into the
	// attempt's error.
	Check func(reply string) error
	// Explain, when set, tells what the test can see right after a failed
	// or slow attempt (conntrack entries, kp's last sync), for its message.
	Explain func() string
}

// Loop opens new TCP connections, one after the other, until stopped, and
// records each attempt's latency: what a Service's clients do, measured
// tightly enough to see a lost SYN.
type Loop struct {
	spec LoopSpec
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	log  []Attempt
}

// StartLoop starts a loop; it stops by itself after 10 minutes whatever
// happens.
func StartLoop(spec LoopSpec) *Loop {
	if spec.Slow == 0 {
		spec.Slow = SlowConnect
	}
	if spec.Timeout == 0 {
		spec.Timeout = 5 * time.Second
	}
	l := &Loop{spec: spec, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		end := time.After(10 * time.Minute)
		for i := 0; ; i++ {
			a := l.attempt(spec.Addrs[i%len(spec.Addrs)])
			l.mu.Lock()
			l.log = append(l.log, a)
			l.mu.Unlock()
			select {
			case <-l.stop:
				return
			case <-end:
				return
			case <-time.After(spec.Pause):
			}
		}
	}()
	return l
}

func (l *Loop) attempt(addr string) Attempt {
	a := Attempt{At: time.Now(), Addr: addr}
	ctx, cancel := context.WithTimeout(context.Background(), l.spec.Timeout)
	defer cancel()
	c, err := l.spec.Dial(ctx, "tcp", addr)
	a.Connect = time.Since(a.At)
	if err == nil {
		a.SYNRetransmits = synRetransmits(c)
		a.Reply, err = Ask(ctx, c)
		c.Close()
		if err == nil {
			a.Answer = time.Since(a.At)
		}
	}
	if err == nil && l.spec.Check != nil {
		err = l.spec.Check(a.Reply)
	}
	a.Err = err
	if l.spec.Explain != nil && (err != nil || a.SYNRetransmits > 0 || a.Latency() > l.spec.Slow) {
		a.Seen = l.spec.Explain()
	}
	return a
}

// Attempts returns the attempts so far.
func (l *Loop) Attempts() []Attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Attempt(nil), l.log...)
}

// Stop ends the loop and returns its summary over every attempt.
func (l *Loop) Stop() Summary {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	return Summarize(l.Attempts(), l.spec.Slow)
}

// Since returns the attempts started at or after t.
func Since(as []Attempt, t time.Time) []Attempt {
	var out []Attempt
	for _, a := range as {
		if !a.At.Before(t) {
			out = append(out, a)
		}
	}
	return out
}

// Summary is what a loop's attempts showed.
type Summary struct {
	Attempts []Attempt
	Bound    time.Duration
	// Failures are the failed attempts' lines (see Attempt.Failure); Slow
	// counts those that got through slower than Bound.
	Failures []string
	Slow     int
	// Worst is the longest latency of an attempt that got through, at
	// WorstAt.
	Worst   time.Duration
	WorstAt time.Time
}

// Summarize sums up attempts with bound on their latency.
func Summarize(as []Attempt, bound time.Duration) Summary {
	s := Summary{Attempts: as, Bound: bound}
	for _, a := range as {
		if f := a.Failure(bound); f != "" {
			s.Failures = append(s.Failures, f)
			if a.Err == nil {
				s.Slow++
			}
		}
		if a.Err == nil && a.Latency() > s.Worst {
			s.Worst, s.WorstAt = a.Latency(), a.At
		}
	}
	return s
}

// Since is the summary of the attempts started at or after t.
func (s Summary) Since(t time.Time) Summary {
	return Summarize(Since(s.Attempts, t), s.Bound)
}

// String is the summary's line: "120 new connections, 2 failed (1 of them
// slow: answered after more than 900ms), worst answer 1.02s at 15:04:05.000".
func (s Summary) String() string {
	worst := "none answered"
	if !s.WorstAt.IsZero() {
		worst = fmt.Sprintf("worst answer after %v at %s", s.Worst.Round(time.Millisecond), s.WorstAt.Format("15:04:05.000"))
	}
	return fmt.Sprintf("%d new connections, %d failed (%d of them slow: answered after more than %v), %s",
		len(s.Attempts), len(s.Failures), s.Slow, s.Bound, worst)
}

// Err is nil when every attempt got through within the bound; otherwise
// it names the first failure on its first line (a digest of the output,
// test/failures.sh, keeps only that), then the summary and every failure.
func (s Summary) Err() error {
	if len(s.Failures) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d new connections failed (%d slow), first %s\n%s\n%s",
		len(s.Failures), len(s.Attempts), s.Slow, s.Failures[0], s, strings.Join(s.Failures, "\n"))
}

// synRetransmits reads the kernel's count of c's retransmitted segments;
// right after the handshake that is the SYN's.
func synRetransmits(c net.Conn) uint32 { return Retransmits(c) }

// Retransmits is the kernel's count of the segments TCP connection c sent
// again (TCP_INFO's total), 0 when c is no TCP socket.
func Retransmits(c net.Conn) uint32 {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	var n uint32
	_ = raw.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n = info.Total_retrans
		}
	})
	return n
}
