package userspace

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// errIdle ends a copy whose connection carried nothing either way for the
// idle timeout.
var errIdle = errors.New("idle timeout")

// idleWatch tells when a TCP connection's two copies have both been idle
// for timeout. The copies stay io.Copy between the two *net.TCPConn (so
// the kernel splices), each under a read deadline of timeout/2: a copy
// that returns at its deadline having moved bytes marks the connection
// active; one that moved none ends it when the other direction has been
// quiet too. A silent connection closes after between timeout and 1.5 ×
// timeout.
type idleWatch struct {
	timeout time.Duration
	last    atomic.Int64 // unix nanoseconds of the last progress seen
	fired   atomic.Bool  // one copy returned errIdle (the other need not)
}

func newIdleWatch(timeout time.Duration) *idleWatch {
	w := &idleWatch{timeout: timeout}
	w.last.Store(time.Now().UnixNano())
	return w
}

// copy copies src to dst until src ends (nil), an error, or errIdle.
func (w *idleWatch) copy(dst io.Writer, src *net.TCPConn) (int64, error) {
	if w.timeout <= 0 {
		return io.Copy(dst, src)
	}
	var total int64
	for {
		src.SetReadDeadline(time.Now().Add(w.timeout / 2))
		n, err := io.Copy(dst, src)
		total += n
		now := time.Now()
		if n > 0 {
			w.last.Store(now.UnixNano())
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return total, err
		}
		if now.Sub(time.Unix(0, w.last.Load())) >= w.timeout {
			if w.fired.CompareAndSwap(false, true) {
				return total, errIdle
			}
			return total, err // the other copy closes the connection
		}
	}
}
