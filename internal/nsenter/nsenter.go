// Package nsenter runs code inside another network namespace, for the
// commands and tests that act on a namespace kp runs in.
package nsenter

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
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

// Open opens a network namespace by path (/proc/PID/ns/net, or any
// bind mount of one) or by the name ip-netns(8) gave it (/run/netns/NAME).
func Open(spec string) (int, error) {
	path := spec
	if !strings.Contains(spec, "/") {
		path = "/run/netns/" + spec
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("network namespace %q: open %s: %w", spec, path, err)
	}
	return fd, nil
}

// RunFd runs fn inside the namespace fd refers to; fd 0 is the caller's
// own, and fn then runs as is.
func RunFd(fd int, fn func() error) error {
	if fd <= 0 {
		return fn()
	}
	return Run(netns.NsHandle(fd), fn)
}

// DialContextFd returns a DialContext that opens its connections inside the
// namespace fd refers to (kp's status API listens on that namespace's
// loopback).
func DialContextFd(fd int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if fd <= 0 {
		return (&net.Dialer{}).DialContext
	}
	return DialContext(netns.NsHandle(fd))
}
