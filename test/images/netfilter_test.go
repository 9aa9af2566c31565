package images

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// The distroless-iptables image's tools, run from its own tree inside a
// test namespace: each must reach the kernel through netlink (iptables-nft
// and nft, ipset, conntrack), as upstream's CLOSE_WAIT test does on a node.
func TestDistrolessIptablesToolsReadANamespacesTables(t *testing.T) {
	img := Get(t, DistrolessIptables)
	netns.Require(t, "chroot")
	ns := netns.NewNamespace(t, "ipt")
	root := extract(t, img)
	for _, c := range []struct {
		cmd, want string
	}{
		{"iptables -t nat -N KP-PROBE && iptables-save -t nat", ":KP-PROBE - [0:0]"},
		{"nft list ruleset", "table ip nat"},
		{"ipset create kp-probe hash:ip && ipset list -n", "kp-probe"},
		// What the test pipes, on this namespace's empty table.
		{"conntrack -L -f ipv4 -d 10.0.0.1 2>&1 | grep -m 1 'flow entries'", "0 flow entries have been shown"},
	} {
		out, err := netns.Exec(ns, "chroot", root, "/bin/sh", "-c", c.cmd)
		if err != nil || !strings.Contains(out, c.want) {
			t.Errorf("%s in %s: %v, output (want %q):\n%s", c.cmd, img.Ref, err, c.want, out)
		}
	}
}

// Upstream's boom server, from its image's tree in a test namespace with
// POD_IP 127.0.0.1: it must listen on 9000, see the handshake of a
// connection on its raw socket, and inject its out-of-window segment.
// Without POD_IP(S) it has nothing to watch and says so.
func TestRegressionIssue74839InjectsItsBoomPacket(t *testing.T) {
	img := Get(t, RegressionIssue74839)
	netns.Require(t, "chroot", "env")
	root := extract(t, img)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "chroot", root, "/regression-issue-74839").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "No valid IP found") {
		t.Errorf("%s without POD_IP: %v, want a panic naming no valid IP, output:\n%s", img.Ref, err, out)
	}

	ns := netns.NewNamespace(t, "boom")
	p := netns.StartIn(t, ns, "env", "POD_IP=127.0.0.1", "chroot", root, "/regression-issue-74839")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Log(), "listen on 0.0.0.0:9000") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	c, err := netns.DialConn(ctx, ns, "tcp", "127.0.0.1:9000")
	if err != nil {
		t.Fatalf("dial %s in %s: %v", img.Ref, ns, err)
	}
	defer c.Close()
	for !strings.Contains(p.Log(), "boom packet injected") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if log := p.Log(); !strings.Contains(log, "connection established") || !strings.Contains(log, "boom packet injected") {
		t.Errorf("%s: no boom packet after a connection; log:\n%s", img.Ref, log)
	}
}
