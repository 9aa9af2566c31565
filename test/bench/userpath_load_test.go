package bench

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// loadWindow runs attempt from namespace ns with workers in parallel for
// window, and past it until each of spread targets had one attempt: the
// k-th attempt of the window (over all workers) goes to target k mod
// spread. attempt returns the time it measures, or why it failed.
func loadWindow(ns string, workers int, window time.Duration, spread int,
	attempt func(target int, buf []byte) (time.Duration, error)) UserPath {
	var next, bad atomic.Int64
	reached := make([]atomic.Bool, spread)
	var mu sync.Mutex
	var times []float64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(window)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []float64
			err := netns.InNamespace(ns, func() error {
				buf := make([]byte, 256)
				for {
					k := int(next.Add(1) - 1)
					if k >= spread && time.Now().After(deadline) {
						return nil
					}
					took, err := attempt(k%spread, buf)
					if err != nil {
						bad.Add(1)
						continue
					}
					mine = append(mine, took.Seconds())
					reached[k%spread].Store(true)
				}
			})
			if err != nil {
				bad.Add(1)
			}
			mu.Lock()
			times = append(times, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	u := UserPath{Count: len(times), Errors: int(bad.Load()), PerSec: float64(len(times)) / elapsed.Seconds()}
	u.P50, u.P99 = percentiles(times)
	for i := range reached {
		if reached[i].Load() {
			u.Reached++
		}
	}
	return u
}

// tcpWindow is loadWindow of new TCP connections to addrs in turn:
// connect (timed: connect() start to established), read the greeting,
// reset (SO_LINGER 0: no TIME_WAIT to run the client out of ports, and
// conntrack forgets the flow at once). The data path's Service-0 windows
// are its one-address case.
func tcpWindow(ns string, addrs []string, workers int, window time.Duration) UserPath {
	d := net.Dialer{Timeout: time.Second}
	return loadWindow(ns, workers, window, len(addrs), func(k int, buf []byte) (time.Duration, error) {
		began := time.Now()
		c, err := d.Dial("tcp", addrs[k])
		if err != nil {
			return 0, err
		}
		took := time.Since(began)
		defer c.Close()
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.SetDeadline(time.Now().Add(time.Second))
		_, err = c.Read(buf)
		return took, err
	})
}

// udpWindow is loadWindow of UDP exchanges with the echo server at addr,
// each from a new socket (a new source port: a new flow through the
// proxy's rules, as a resolver's random source port makes), timed from
// the request sent to the reply read.
func udpWindow(ns, addr string, workers int, window time.Duration) UserPath {
	req := []byte("?\n")
	return loadWindow(ns, workers, window, 1, func(_ int, buf []byte) (time.Duration, error) {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		began := time.Now()
		if _, err := c.Write(req); err != nil {
			return 0, err
		}
		if _, err := c.Read(buf); err != nil {
			return 0, err
		}
		return time.Since(began), nil
	})
}
