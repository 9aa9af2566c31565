package e2e

// kp sets the node's conntrack sysctls at start, as upstream kube-proxy
// does with its --conntrack-* flags: in the node's network namespace, never
// in another; a value it cannot write is a warning, not an exit.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// sysctl reads a net.netfilter sysctl in namespace ns.
func (e *env) sysctl(ns, name string) string {
	e.t.Helper()
	out, err := e.w.Exec(ns, "cat", "/proc/sys/net/netfilter/"+name)
	if err != nil {
		e.t.Fatalf("read %s in %s: %v", name, ns, err)
	}
	return strings.TrimSpace(out)
}

func TestConntrackFlagsSetTheNodeNamespacesSysctlsAndZeroLeavesThem(t *testing.T) {
	e := newEnv(t, modeNFTables, 1)
	const closeWait, established, udp = "nf_conntrack_tcp_timeout_close_wait", "nf_conntrack_tcp_timeout_established", "nf_conntrack_udp_timeout"
	client := e.w.Pods()[0].NS
	before := map[string]string{}
	for _, name := range []string{closeWait, established, udp} {
		before[name] = e.sysctl(e.w.Node(), name)
	}
	if before[closeWait] == "7200" || before[udp] == "45" {
		t.Fatalf("the node namespace starts with the values the test sets: %v", before)
	}
	e.startKP("--conntrack-tcp-timeout-close-wait", "2h", "--conntrack-udp-timeout", "45s",
		"--conntrack-tcp-timeout-established", "0")

	if got := e.sysctl(e.w.Node(), closeWait); got != "7200" {
		t.Errorf("%s = %s in the node, want 7200", closeWait, got)
	}
	if got := e.sysctl(e.w.Node(), udp); got != "45" {
		t.Errorf("%s = %s in the node, want 45", udp, got)
	}
	if got := e.sysctl(e.w.Node(), established); got != before[established] {
		t.Errorf("%s = %s with the flag at 0, want the kernel's %s", established, got, before[established])
	}
	// Another namespace keeps its own values.
	if got := e.sysctl(client, closeWait); got != before[closeWait] {
		t.Errorf("%s = %s in a pod's namespace, want %s: kp wrote outside its namespace", closeWait, got, before[closeWait])
	}
	log := e.kp.Log()
	for _, want := range []string{
		`msg="set conntrack sysctl" sysctl=net.netfilter.nf_conntrack_tcp_timeout_close_wait old=` + before[closeWait] + ` new=7200`,
		`msg="set conntrack sysctl" sysctl=net.netfilter.nf_conntrack_udp_timeout old=` + before[udp] + ` new=45`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("kp's log lacks %q:\n%s", want, log)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	status, err := e.statusClient().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reported int
	for _, s := range status.Sysctls {
		if s.Error == "" && s.Value == s.Want {
			reported++
		}
	}
	if reported != 2 {
		t.Errorf("status API sysctls: %+v, want the two set", status.Sysctls)
	}
}

func TestConntrackSysctlsOnAReadOnlyProcSysAreWarningsAndKpRuns(t *testing.T) {
	e := newEnv(t, modeNFTables, 2)
	backend := e.w.Pods()[0]
	e.write("web.yaml", web(backend))
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		t.Fatal(err)
	}
	// kp in a mount namespace of its own whose /proc/sys is read-only, as
	// in a container without privileges.
	script := `mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$0" "$@"`
	args := append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, kp},
		e.kpArgs("--conntrack-tcp-timeout-close-wait", "2h")...)
	e.kp = e.w.StartInNode(t, "/usr/bin/unshare", args...)
	e.waitHealthy()
	e.answers(e.w.Pods()[1].NS, "tcp", webTCP)

	log := e.kp.Log()
	if !strings.Contains(log, `level=WARN msg="cannot set a conntrack sysctl; kp goes on with the kernel's value" sysctl=net.netfilter.nf_conntrack_tcp_timeout_close_wait want=7200`) ||
		!strings.Contains(log, "read-only file system") {
		t.Errorf("no warning naming the sysctl and the read-only file system:\n%s", log)
	}
	if got := e.sysctl(e.w.Node(), "nf_conntrack_tcp_timeout_close_wait"); got == "7200" {
		t.Errorf("close_wait is 7200 although /proc/sys was read-only")
	}
}
