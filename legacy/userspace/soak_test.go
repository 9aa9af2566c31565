package userspace

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// openFDs counts this process's file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// fdList names this process's file descriptors (for a leak's report).
func fdList() string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var b strings.Builder
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		fmt.Fprintf(&b, "%s -> %s\n", e.Name(), target)
	}
	return b.String()
}

// TestKernelSoakLeaksNoFileDescriptorNorGoroutine is the soak in
// miniature: 5,000 TCP connections through a ClusterIP over about 10 s
// (4 clients in the client namespace) next to a UDP flow of one datagram
// every 10 ms; afterwards the process holds as many descriptors and
// goroutines as before.
func TestKernelSoakLeaksNoFileDescriptorNorGoroutine(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: 10 s")
	}
	k := newKernelWorld(t, 2)
	p0, p1 := k.w.Pods()[0], k.w.Pods()[1]
	k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 0, p0.IP.String()+":8080", p1.IP.String()+":8080")
	k.add("dns", v1.ProtocolUDP, "10.96.0.12", 53, 0, p0.IP.String()+":5353", p1.IP.String()+":5353")
	k.sync()
	if _, err := k.ask(k.w.Client(), "tcp", "10.96.0.10:80"); err != nil {
		t.Fatal(err)
	}
	settle := func() {
		deadline := time.Now().Add(10 * time.Second)
		for k.b.conns.len() > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
		// io.Copy's splice keeps pipes in a sync.Pool, closed by
		// finalizers once two collections have emptied the pool: cached,
		// not leaked.
		for range 3 {
			runtime.GC()
			time.Sleep(50 * time.Millisecond)
		}
	}
	settle()
	fds0, gr0 := openFDs(t), runtime.NumGoroutine()

	const conns, workers = 5000, 4
	var failed, done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := make(chan struct{})
	var udpSent, udpAnswered atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		netns.InNamespace(k.w.Client(), func() error {
			c, err := net.Dial("udp", "10.96.0.12:53")
			if err != nil {
				return err
			}
			defer c.Close()
			buf := make([]byte, 256)
			for {
				select {
				case <-stop:
					return nil
				default:
				}
				c.Write([]byte("?\n"))
				udpSent.Add(1)
				c.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := c.Read(buf); err == nil {
					udpAnswered.Add(1)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}()
	var tcpWG sync.WaitGroup
	for w := range workers {
		tcpWG.Add(1)
		go func() {
			defer tcpWG.Done()
			netns.InNamespace(k.w.Client(), func() error {
				for i := w; i < conns; i += workers {
					// Paced: conns spread over 10 s.
					if d := time.Until(start.Add(time.Duration(i) * 10 * time.Second / conns)); d > 0 {
						time.Sleep(d)
					}
					c, err := net.DialTimeout("tcp", "10.96.0.10:80", 2*time.Second)
					if err != nil {
						failed.Add(1)
						continue
					}
					c.SetDeadline(time.Now().Add(2 * time.Second))
					if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
						failed.Add(1)
					}
					c.Close()
					done.Add(1)
				}
				return nil
			})
		}()
	}
	tcpWG.Wait()
	close(stop)
	wg.Wait()
	t.Logf("%d TCP connections in %v, %d failed; UDP %d/%d answered", done.Load(), time.Since(start).Round(time.Millisecond),
		failed.Load(), udpAnswered.Load(), udpSent.Load())
	if failed.Load() > 0 {
		t.Errorf("%d of %d connections failed", failed.Load(), conns)
	}
	if udpAnswered.Load() < udpSent.Load()*99/100 {
		t.Errorf("UDP flow: %d of %d datagrams answered", udpAnswered.Load(), udpSent.Load())
	}
	counters, _ := k.b.EndpointCounters(k.st)
	var n uint64
	for _, c := range counters {
		n += c.Packets
	}
	if n < conns {
		t.Errorf("the proxy counted %d connections, want at least %d", n, conns)
	}

	// The UDP session ends after its idle timeout (2 s here).
	settle()
	var fds, gr int
	deadline := time.Now().Add(10 * time.Second)
	for {
		fds, gr = openFDs(t), runtime.NumGoroutine()
		if fds <= fds0 && gr <= gr0+2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("file descriptors %d → %d, goroutines %d → %d", fds0, fds, gr0, gr)
	if fds > fds0 {
		t.Errorf("file descriptors: %d before, %d after:\n%s", fds0, fds, fdList())
	}
	if gr > gr0+2 {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after\n%s", gr0, gr, buf[:runtime.Stack(buf, true)])
	}
}
