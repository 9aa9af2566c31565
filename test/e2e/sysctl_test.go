package e2e

// kp sets the node's conntrack sysctls at start, as upstream kube-proxy
// does with its --conntrack-* flags: in the node's network namespace, never
// in another; a value it cannot write is a warning, not an exit.

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

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
	// Every flag whose sysctl a network namespace has its own copy of;
	// --conntrack-max-per-core sizes a table only the initial namespace
	// may: the unit tests in cmd/kp cover its arithmetic, and a sysctl kp
	// cannot write is the read-only test's below.
	flags := []struct{ flag, value, sysctl, want string }{
		{"--conntrack-tcp-timeout-established", "2h", "nf_conntrack_tcp_timeout_established", "7200"},
		{"--conntrack-tcp-timeout-close-wait", "30m", "nf_conntrack_tcp_timeout_close_wait", "1800"},
		{"--conntrack-tcp-be-liberal", "true", "nf_conntrack_tcp_be_liberal", "1"},
		{"--conntrack-udp-timeout", "45s", "nf_conntrack_udp_timeout", "45"},
		{"--conntrack-udp-timeout-stream", "3m", "nf_conntrack_udp_timeout_stream", "180"},
	}
	for _, set := range []bool{true, false} {
		name := "each flag sets its sysctl in the node namespace only"
		if !set {
			name = "zero leaves every sysctl as the kernel has it"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, modeNFTables, 1)
			client := e.w.Pods()[0].NS
			var args []string
			before := map[string]string{}
			for _, f := range flags {
				before[f.sysctl] = e.sysctl(e.w.Node(), f.sysctl)
				if before[f.sysctl] == f.want {
					t.Fatalf("the node namespace starts with %s = %s, the value the test sets", f.sysctl, f.want)
				}
				value := f.value
				if !set {
					value = "0"
					if f.value == "true" {
						value = "false"
					}
				}
				args = append(args, f.flag+"="+value)
			}
			e.startKP(args...)

			log := e.kp.Log()
			for _, f := range flags {
				want := f.want
				if !set {
					want = before[f.sysctl]
				}
				if got := e.sysctl(e.w.Node(), f.sysctl); got != want {
					t.Errorf("%s=%s: %s = %s in the node, want %s", f.flag, f.value, f.sysctl, got, want)
				}
				// Another namespace keeps its own values.
				if got := e.sysctl(client, f.sysctl); got != before[f.sysctl] {
					t.Errorf("%s = %s in a pod's namespace, want %s: kp wrote outside its namespace", f.sysctl, got, before[f.sysctl])
				}
				line := `] "set conntrack sysctl" sysctl="net.netfilter.` + f.sysctl + `" old="` + before[f.sysctl] + `" new="` + f.want + `"`
				if strings.Contains(log, line) != set {
					t.Errorf("kp's log has %q: %v, want %v:\n%s", line, !set, set, log)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			status, err := e.statusClient().Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var inForce int
			for _, s := range status.Sysctls {
				if s.Error == "" && s.Value == s.Want {
					inForce++
				}
			}
			if want := map[bool]int{true: len(flags), false: 0}[set]; inForce != want || len(status.Sysctls) != want {
				t.Errorf("status API sysctls: %+v, want the %d set", status.Sysctls, want)
			}
		})
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
	if !regexp.MustCompile(`(?m)^W\d{4} .*\] "cannot set a conntrack sysctl; kp goes on with the kernel's value" sysctl="net.netfilter.nf_conntrack_tcp_timeout_close_wait" want="7200"`).MatchString(log) ||
		!strings.Contains(log, "read-only file system") {
		t.Errorf("no warning naming the sysctl and the read-only file system:\n%s", log)
	}
	if got := e.sysctl(e.w.Node(), "nf_conntrack_tcp_timeout_close_wait"); got == "7200" {
		t.Errorf("close_wait is 7200 although /proc/sys was read-only")
	}
}

// startReadOnly starts kp in the node namespace inside a mount namespace
// of its own whose /proc/sys is read-only, as in a container without
// privileges, and waits until it is healthy.
func (e *env) startReadOnly(kp string, extra ...string) {
	e.t.Helper()
	script := `mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$0" "$@"`
	args := append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, kp}, e.kpArgs(extra...)...)
	e.kp = e.w.StartInNode(e.t, "/usr/bin/unshare", args...)
	e.waitHealthy()
}

// The iptables mode's sysctl (route_localnet, which IPv4 NodePorts on
// 127.0.0.1 need) with kp in a read-only /proc/sys, as the DaemonSet's
// proxy container: without the init step, kp serves and warns once,
// naming the sysctl, its value, the value wanted and the fix; after kp
// sysctl with the same flags (the privileged init container), the sysctl
// is set, kp warns about none, and the NodePort answers on 127.0.0.1.
func TestModeSysctlsOnAReadOnlyProcSysAreSetByTheInitStepAndCheckedByKp(t *testing.T) {
	for _, m := range iptablesBackends {
		t.Run(m.name, func(t *testing.T) {
			e := newEnv(t, m, 2)
			svc := web(e.w.Pods()[0])
			svc.Type, svc.Ports[0].NodePort, svc.Ports[1].NodePort = v1.ServiceTypeNodePort, 30080, 30053
			e.write("web.yaml", svc)
			kp, err := netns.Build("./cmd/kp")
			if err != nil {
				t.Fatal(err)
			}
			const name = "net.ipv4.conf.all.route_localnet"
			routeLocalnet := func() string {
				out, err := e.w.Exec(e.w.Node(), "cat", "/proc/sys/net/ipv4/conf/all/route_localnet")
				if err != nil {
					t.Fatalf("read %s: %v", name, err)
				}
				return strings.TrimSpace(out)
			}
			if v := routeLocalnet(); v != "0" {
				t.Fatalf("a new node namespace has %s = %s, want 0", name, v)
			}
			warning := regexp.MustCompile(`(?m)^W\d{4} .*\] "a sysctl the proxy mode needs is not set and kp cannot set it" mode="iptables" ` +
				`sysctl="` + regexp.QuoteMeta(name) + `" value="0" want="1" .*read-only file system.* fix="run kp sysctl with kp proxy's config .*init container`)

			backend := e.podNames(e.w.Pods()[0])
			e.startReadOnly(kp)
			e.answers(e.w.Pods()[1].NS, "tcp", webTCP, backend...)
			// Without route_localnet the mode leaves 127.0.0.1 out: the
			// same request the init step makes answer is refused here.
			if name, err := e.ask(e.w.Node(), "tcp", "127.0.0.1:30080"); err == nil {
				t.Errorf("without route_localnet, 127.0.0.1:30080 answered (by %s)", name)
			}
			log := e.kp.Log()
			if n := len(warning.FindAllString(log, -1)); n != 1 || strings.Count(log, "the proxy mode needs is not set") != 1 {
				t.Errorf("without the init step: %d warnings naming %s, its value 0, 1 wanted and the fix; want exactly 1:\n%s", n, name, log)
			}
			t.Logf("without the init step: %s", warning.FindString(log))
			if err := e.kp.Stop(); err != nil {
				t.Logf("stop kp: %v", err)
			}

			// The init step: kp sysctl, the same flags, a writable /proc/sys.
			out, err := e.w.Exec(e.w.Node(), append([]string{kp, "sysctl"}, e.kpArgs()[1:]...)...)
			if err != nil {
				t.Fatalf("kp sysctl: %v\n%s", err, out)
			}
			if v := routeLocalnet(); v != "1" || !strings.Contains(out, `"set a sysctl the proxy mode needs" mode="iptables" sysctl="`+name+`" old="0" new="1"`) {
				t.Fatalf("after kp sysctl: %s = %s, want 1 and the change logged:\n%s", name, v, out)
			}
			e.startReadOnly(kp)
			if log := e.kp.Log(); strings.Contains(log, "the proxy mode needs is not set") || regexp.MustCompile(`(?m)^W.*sysctl`).MatchString(log) {
				t.Errorf("after the init step kp still warns about a sysctl:\n%s", log)
			}
			e.answers(e.w.Node(), "tcp", "127.0.0.1:30080", backend...)
			e.answers(e.w.Pods()[1].NS, "tcp", webTCP, backend...)
		})
	}
}
