package userspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

// fdChildEnv carries the child's work: "nodeNS,podIP,limit,servicePorts".
const fdChildEnv = "KP_USERSPACE_FDLIMIT_CHILD"

// fdVIP is the ClusterIP of the i-th service port of the child.
func fdVIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 96, byte(1 + i/200), byte(i%200 + 1)})
}

// More service ports than RLIMIT_NOFILE allows listeners, on the real
// kernel, with the real limit (set in a child process, so this test binary
// keeps its own): the redirect rules are written, a Service within the
// budget answers, one past it is refused at once. Before the budget, the
// listeners took every descriptor, the netlink socket of the redirect
// writer failed, and no Service answered.
func TestKernelOverTheDescriptorLimitTheServicesWithinItAnswer(t *testing.T) {
	w := netns.NewWorld(t, netns.Options{Pods: 1})
	pod := w.Pods()[0]
	// 700 service ports under a limit of 600: the listeners may hold
	// 600 - 256 - 150 = 194.
	const limit, n = 600, 700
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestKernelFDLimitChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%d,%d", fdChildEnv, w.Node(), pod.IP, limit, n))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close() // the child shuts down and exits
		if err := cmd.Wait(); err != nil {
			t.Errorf("the child: %v\n%s", err, stderr.String())
		}
	}()
	var result string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if r, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
			result = r
			break
		}
	}
	go io.Copy(io.Discard, stdout)
	if result == "" {
		t.Fatalf("the child said nothing:\n%s", stderr.String())
	}
	t.Logf("the child under RLIMIT_NOFILE %d, %d service ports: %s", limit, n, result)
	if !strings.Contains(result, `syncErr=""`) {
		t.Errorf("the sync failed: %s\n%s", result, stderr.String())
	}
	for _, tc := range []struct {
		name    string
		i       int
		answers bool
	}{
		{"the first service port by name has a listener", 0, true},
		{"the last within the budget", 193, true},
		{"the first past the budget is refused at once", 194, false},
		{"the last is refused at once", n - 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := netip.AddrPortFrom(fdVIP(tc.i), 80).String()
			start := time.Now()
			reply, err := netns.Dial(w.Client(), "tcp", addr, 2*time.Second)
			name, _ := netns.ParseReply(reply)
			if tc.answers && (err != nil || name != pod.Name) {
				t.Errorf("svc-%03d (%s): %q %v, want %s's answer", tc.i, addr, name, err, pod.Name)
			}
			if !tc.answers && (!errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second) {
				t.Errorf("svc-%03d (%s): %q %v after %v, want refused at once", tc.i, addr, name, err, time.Since(start))
			}
		})
	}
}

// TestKernelFDLimitChild is the child of
// TestKernelOverTheDescriptorLimitTheServicesWithinItAnswer: it lowers its
// own RLIMIT_NOFILE (soft and hard), syncs the service ports into the node
// namespace, prints a RESULT line and holds the listeners until its stdin
// closes.
func TestKernelFDLimitChild(t *testing.T) {
	spec := os.Getenv(fdChildEnv)
	if spec == "" {
		t.Skip("run by TestKernelOverTheDescriptorLimitTheServicesWithinItAnswer")
	}
	var node, podIP string
	var limit uint64
	var n int
	if _, err := fmt.Sscanf(strings.ReplaceAll(spec, ",", " "), "%s %s %d %d", &node, &podIP, &limit, &n); err != nil {
		t.Fatalf("%s=%q: %v", fdChildEnv, spec, err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
	h, err := vnetns.GetFromName(node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	b, err := New(proxy.Config{Mode: proxy.ModeUserspace, UserspaceRedirect: RedirectNFTables}, log, NamespaceOps(h))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := b.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	st := &proxy.State{Generation: 1, Services: map[proxy.ServicePortName]*proxy.ServicePort{},
		Endpoints:    map[proxy.ServicePortName][]proxy.Endpoint{},
		ServiceCIDRs: []netip.Prefix{netns.ServiceCIDR},
		Node:         proxy.Node{Name: "node-1"}}
	for i := range n {
		name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: fmt.Sprintf("svc-%03d", i)},
			Protocol: v1.ProtocolTCP}
		st.Services[name] = &proxy.ServicePort{Name: name, Type: v1.ServiceTypeClusterIP, Protocol: v1.ProtocolTCP, Port: 80,
			ClusterIPs: []netip.Addr{fdVIP(i)}}
		st.Endpoints[name] = []proxy.Endpoint{proxy.Endpoint{IP: netip.MustParseAddr(podIP), Port: 8080, Ready: true, Serving: true}.At("node-1", "")}
	}
	syncErr := ""
	if err := b.Sync(ctx, st); err != nil {
		syncErr = err.Error()
		if len(syncErr) > 300 {
			syncErr = syncErr[:300] + "…"
		}
	}
	rules := b.LastRules(proxy.IPv4)
	fmt.Printf("RESULT redirects=%d rejects=%d syncErr=%q\n", len(rules.Redirects), len(rules.Rejects), syncErr)
	io.Copy(io.Discard, os.Stdin)
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	b.Shutdown(sctx)
}
