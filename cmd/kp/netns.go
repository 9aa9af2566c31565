package main

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// openNetns opens a network namespace by path (/proc/PID/ns/net, or any
// bind mount of one) or by the name ip-netns(8) gave it (/run/netns/NAME).
func openNetns(spec string) (int, error) {
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

// inNetns runs fn on an OS thread that joined the namespace fd refers to
// (fd 0: the caller's own, fn runs as is). Sockets fn opens stay in that
// namespace. A thread that cannot return to its namespace is never reused:
// it stays locked and the runtime ends it with its goroutine.
func inNetns(fd int, fn func() error) error {
	if fd <= 0 {
		return fn()
	}
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
		if err := netns.Set(netns.NsHandle(fd)); err != nil {
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

// dialerIn returns a DialContext that opens its connections inside the
// namespace fd refers to (kp's status API listens on that namespace's
// loopback).
func dialerIn(fd int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetns(fd, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
