package main

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/internal/nsenter"
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

// inNetns runs fn inside the namespace fd refers to; fd 0 is the caller's
// own, and fn then runs as is.
func inNetns(fd int, fn func() error) error {
	if fd <= 0 {
		return fn()
	}
	return nsenter.Run(netns.NsHandle(fd), fn)
}

// dialerIn returns a DialContext that opens its connections inside the
// namespace fd refers to (kp's status API listens on that namespace's
// loopback).
func dialerIn(fd int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if fd <= 0 {
		return (&net.Dialer{}).DialContext
	}
	return nsenter.DialContext(netns.NsHandle(fd))
}
