package netns

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kpproxy/kp/internal/nsenter"
)

// ip runs one iproute2 command and returns its error with the output.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Exec runs a command inside namespace ns and returns its combined output.
func Exec(ns string, cmd ...string) (string, error) {
	args := append([]string{"netns", "exec", ns}, cmd...)
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s: %w: %s", ns, strings.Join(cmd, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// InNamespace runs fn on an OS thread that has joined namespace ns. Sockets
// fn opens belong to ns for their whole life, so they may be used from any
// goroutine afterwards. Safe for concurrent use: each call has its own thread.
func InNamespace(ns string, fn func() error) error {
	target, err := netns.GetFromName(ns)
	if err != nil {
		return fmt.Errorf("enter %s: %w", ns, err)
	}
	defer target.Close()
	return nsenter.Run(target, fn)
}

// DialConn opens a connection from inside namespace ns.
func DialConn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	target, err := netns.GetFromName(ns)
	if err != nil {
		return nil, fmt.Errorf("enter %s: %w", ns, err)
	}
	defer target.Close()
	return nsenter.DialContext(target)(ctx, network, addr)
}

// Dial asks the echo server at addr from inside namespace ns and returns its
// reply line ("pod-1 10.0.2.2:40312") without the newline. network is "tcp"
// or "udp" (or tcp4, udp6, …). For UDP one datagram is sent and one reply
// awaited. timeout bounds the whole exchange. A refused connection (TCP reset
// or ICMP unreachable) comes back as an error wrapping syscall.ECONNREFUSED.
func Dial(ns, network, addr string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := DialConn(ctx, ns, network, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return Ask(ctx, c)
}

// DialFromPort is Dial over TCP from a fixed source address and port, as a
// client whose port is reused: the connection's conntrack entry is then
// known in advance, and may be an old one's.
func DialFromPort(ns string, src netip.AddrPort, addr string, timeout time.Duration) (string, error) {
	var reply string
	err := InNamespace(ns, func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(src), Timeout: timeout}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		reply, err = Ask(ctx, c)
		return err
	})
	return reply, err
}

// Ask asks the echo server at the other end of c (dialed from anywhere) for
// its reply line, within ctx's deadline: for UDP one datagram is sent and
// one reply awaited.
func Ask(ctx context.Context, c net.Conn) (string, error) {
	if deadline, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(deadline)
	}
	network, addr := c.RemoteAddr().Network(), c.RemoteAddr().String()
	if strings.HasPrefix(network, "udp") {
		if _, err := c.Write([]byte("?\n")); err != nil {
			return "", err
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read reply from %s %s: %w", network, addr, err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// ParseReply splits an echo reply into the server's name and the client
// address it saw.
func ParseReply(reply string) (name, client string) {
	name, client, _ = strings.Cut(reply, " ")
	return name, client
}

// HTTPGet fetches url from inside namespace ns and returns the status code
// and body.
func HTTPGet(ns, url string, timeout time.Duration) (int, string, error) {
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			// Plain bodies: the benchmark polls a proxy's metrics every
			// 50 ms through a cold start, and each gzip-compressed answer
			// cost the proxy a new compressor (25 MB of kp's garbage in a
			// 10,000-Service cold start), which no scraper asks for that
			// often.
			DisableCompression: true,
			Proxy:              nil,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return DialConn(ctx, ns, network, addr)
			},
		},
	}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), err
}

// setSysctls writes sysctls inside namespace ns, through /proc/sys as seen
// by a thread in that namespace (no dependency on procps' sysctl).
// Keys are dotted: "net.ipv4.ip_forward".
func setSysctls(ns string, kv ...string) error {
	return InNamespace(ns, func() error {
		for i := 0; i+1 < len(kv); i += 2 {
			p := filepath.Join("/proc/sys", strings.ReplaceAll(kv[i], ".", "/"))
			if err := os.WriteFile(p, []byte(kv[i+1]), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s in %s: %w", kv[i], kv[i+1], ns, err)
			}
		}
		return nil
	})
}
