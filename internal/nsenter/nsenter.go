// Package nsenter runs code inside another network namespace, for the
// commands and tests that act on a namespace kp runs in.
package nsenter

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// Run runs fn on an OS thread that joined the network namespace ns. Sockets
// fn opens belong to ns for their whole life, so they may be used from any
// goroutine afterwards. Safe for concurrent use: each call has its own
// thread. A thread that cannot return to its own namespace is never reused:
// it stays locked, and the runtime ends it with its goroutine.
func Run(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// DialContext opens connections inside the network namespace ns, for an
// http.Transport or a net.Dialer's users.
func DialContext(ns netns.NsHandle) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := Run(ns, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
