package userspace

import (
	"bufio"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/logbuf"
)

// syncBuffer is a log sink safe for the proxy's goroutines.
type syncBuffer = logbuf.Buffer

// withSoftNoFile runs fn with the process's soft RLIMIT_NOFILE at soft,
// then puts it back (the hard limit is never touched: without
// CAP_SYS_RESOURCE it could not be raised again).
func withSoftNoFile(t *testing.T, soft uint64, fn func(rl unix.Rlimit)) {
	t.Helper()
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
			t.Errorf("restore RLIMIT_NOFILE: %v", err)
		}
	}()
	low := unix.Rlimit{Cur: soft, Max: orig.Max}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	fn(low)
}

func TestRaiseNoFileRaisesTheSoftLimitToTheHardOneAndLogsIt(t *testing.T) {
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	withSoftNoFile(t, 256, func(low unix.Rlimit) {
		got := raiseNoFile(log)
		var rl unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
		if rl.Cur != low.Max || got.cur != low.Max || got.max != low.Max {
			t.Errorf("after raiseNoFile: soft %d (reported %d/%d), want the hard limit %d", rl.Cur, got.cur, got.max, low.Max)
		}
	})
	if !strings.Contains(out.String(), "RLIMIT_NOFILE=") {
		t.Errorf("no log line names the limit:\n%s", out.String())
	}
}

// Out of descriptors: opening a listener fails with an error naming the
// limit and what to do; a listener that cannot accept logs a line naming
// the limit, and serves again once descriptors are free.
func TestOutOfFileDescriptorsIsSaidClearly(t *testing.T) {
	var out syncBuffer
	b, err := New(proxy.Config{}, slog.New(slog.NewTextHandler(&out, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ep := tcpEcho(t)
	// The listener's accept loop starts once every descriptor is taken,
	// with a connection waiting: its accept must fail.
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	// The test dials the listener itself, which only a redirect does in
	// production: in a namespace where conntrack tracks, that is refused.
	b.ops.redirected = func(*net.TCPConn) error { return nil }
	p := &tcpProxy{name: proxy.ServicePortName{Port: "http"}, ln: ln, bal: newFamilyBalancers(time.Now), b: b,
		log: b.log, close: make(chan struct{})}
	defer p.stop()
	p.bal.v4.update([]netip.AddrPort{ep}, 0)
	addr := ln.Addr().String()
	var client net.Conn
	withSoftNoFile(t, 64, func(low unix.Rlimit) {
		b.setLimits(rlimitInfo{cur: low.Cur, max: low.Max})
		var fill []*os.File
		defer func() {
			for _, f := range fill {
				f.Close()
			}
		}()
		exhaust := func() {
			for {
				f, err := os.Open(os.DevNull)
				if err != nil {
					if !errors.Is(err, syscall.EMFILE) {
						t.Fatal(err)
					}
					return
				}
				fill = append(fill, f)
			}
		}
		exhaust()
		_, err := b.ensure(proxyKey{name: proxy.ServicePortName{Port: "dns"}}, v1.ProtocolUDP)
		if err == nil || !strings.Contains(err.Error(), "RLIMIT_NOFILE is 64") || !strings.Contains(err.Error(), "hard limit") {
			t.Errorf("opening a listener out of descriptors: %v, want an error naming RLIMIT_NOFILE and the hard limit", err)
		}
		// One descriptor for the client; the proxy's accept then has none
		// (or, when another goroutine freed one meanwhile, its dial to the
		// endpoint: the client is reset, and the log says why all the same).
		fill[len(fill)-1].Close()
		fill = fill[:len(fill)-1]
		if client, err = net.Dial("tcp4", addr); err != nil {
			t.Logf("the client's dial while out of descriptors: %v", err)
			client = nil
		}
		exhaust() // whatever another goroutine freed meanwhile
		go p.serve()
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && !strings.Contains(out.String(), "out of file descriptors"); {
			time.Sleep(20 * time.Millisecond)
		}
	})
	if log := out.String(); !strings.Contains(log, "out of file descriptors") || !strings.Contains(log, "limit=64") {
		t.Errorf("no log line says the proxy is out of descriptors, naming the limit:\n%s", log)
	}
	// Descriptors free again: the connection that waited is proxied (if it
	// was not reset), and so is a new one.
	if client != nil {
		defer client.Close()
		if err := echoOnce(client, bufio.NewReader(client), "after"); err != nil {
			t.Logf("the connection that waited for a descriptor: %v", err)
		}
	}
	again, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := echoOnce(again, bufio.NewReader(again), "again"); err != nil {
		t.Errorf("a new connection once descriptors are free: %v", err)
	}
}
