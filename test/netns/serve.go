package netns

import (
	"net"
	"testing"
)

// Serve listens on TCP addr (e.g. ":9090") inside namespace ns and runs
// handle on each accepted connection in its own goroutine, closing the
// connection when handle returns. The listener closes when t ends.
func Serve(t testing.TB, ns, addr string, handle func(net.Conn)) {
	t.Helper()
	var ln net.Listener
	if err := InNamespace(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}
