package main

import (
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/kpproxy/kp/internal/sysctl"
	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/legacy/ipvs"
	"github.com/kpproxy/kp/proxy"
)

// withSysctls is a fake backend of a mode whose Sysctls are those of the
// real backend of that mode built from the same config: the list the
// backend sets itself, so the init step's is the same by construction.
type withSysctls struct {
	*fakeBackend
	real proxy.SysctlNeeder
}

func (b withSysctls) Sysctls() []proxy.Sysctl { return b.real.Sysctls() }

func realSysctlsFactory(m proxy.Mode) backendFactory {
	return func(cfg proxy.Config, log *slog.Logger) (proxy.Backend, error) {
		var real proxy.SysctlNeeder
		var err error
		switch m {
		case proxy.ModeIPVS:
			real, err = ipvs.New(cfg, log)
		case proxy.ModeIPTables:
			real, err = iptables.New(cfg, log)
		}
		return withSysctls{&fakeBackend{mode: m, cfg: cfg}, real}, err
	}
}

// modeSysctlFiles are the mode sysctls the tests' kernel has, all 0.
var modeSysctlFiles = []string{"net.ipv4.vs.conntrack", "net.ipv4.vs.expire_nodest_conn", "net.ipv4.vs.expire_quiescent_template",
	"net.ipv4.ip_forward", "net.ipv4.conf.all.arp_ignore", "net.ipv4.conf.all.arp_announce", "net.ipv4.conf.all.route_localnet"}

func modeSysctlHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	for _, name := range modeSysctlFiles {
		p := sysctl.Dir(h.procSys).Path(name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h.a.backends[proxy.ModeIPVS] = realSysctlsFactory(proxy.ModeIPVS)
	h.a.backends[proxy.ModeIPTables] = realSysctlsFactory(proxy.ModeIPTables)
	return h
}

func modeSysctlValues(t *testing.T, procSys string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range modeSysctlFiles {
		v, err := sysctl.Dir(procSys).Get(name)
		if err != nil {
			t.Fatal(err)
		}
		if v != "0" {
			out[name] = v
		}
	}
	return out
}

func TestInitStepSetsTheSysctlsOfTheModeKpProxyWillRun(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		args         []string
		want         map[string]string
	}{
		{name: "ipvs", config: "mode: ipvs\n", want: map[string]string{"net.ipv4.vs.conntrack": "1",
			"net.ipv4.vs.expire_nodest_conn": "1", "net.ipv4.vs.expire_quiescent_template": "1", "net.ipv4.ip_forward": "1"}},
		{name: "ipvs with strictARP", config: "mode: ipvs\nipvs: {strictARP: true}\n", want: map[string]string{"net.ipv4.vs.conntrack": "1",
			"net.ipv4.vs.expire_nodest_conn": "1", "net.ipv4.vs.expire_quiescent_template": "1", "net.ipv4.ip_forward": "1",
			"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2"}},
		{name: "iptables: localhost NodePorts by default", config: "mode: iptables\n",
			want: map[string]string{"net.ipv4.conf.all.route_localnet": "1"}},
		{name: "iptables without localhost NodePorts", config: "mode: iptables\niptables: {localhostNodePorts: false}\n",
			want: map[string]string{}},
		{name: "iptables with NodePorts on a CIDR without loopback", config: "mode: iptables\nnodePortAddresses: [10.0.0.0/8]\n",
			want: map[string]string{}},
		{name: "nftables needs none", config: "mode: nftables\n", want: map[string]string{}},
		{name: "--init-only does the same", config: "mode: ipvs\n", args: []string{"proxy", "--init-only"},
			want: map[string]string{"net.ipv4.vs.conntrack": "1", "net.ipv4.vs.expire_nodest_conn": "1",
				"net.ipv4.vs.expire_quiescent_template": "1", "net.ipv4.ip_forward": "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := modeSysctlHarness(t)
			args := tc.args
			if args == nil {
				args = []string{"sysctl"}
			}
			path := writeFile(t, "kube-proxy.yaml", header+tc.config)
			if code := h.run(append(args, "--config", path)...); code != 0 || h.ran {
				t.Fatalf("exit %d, proxy ran %v:\n%s", code, h.ran, h.stderr.String())
			}
			got := modeSysctlValues(t, h.procSys)
			if len(got) != len(tc.want) {
				t.Errorf("set %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %s", k, got[k], v)
				}
				if !strings.Contains(h.stderr.String(), `"set a sysctl the proxy mode needs"`) || !strings.Contains(h.stderr.String(), `sysctl="`+k+`" old="0" new="`+v+`"`) {
					t.Errorf("no change of %s logged:\n%s", k, h.stderr.String())
				}
			}
			if strings.Contains(h.stderr.String(), "\nW") {
				t.Errorf("warnings:\n%s", h.stderr.String())
			}
		})
	}
}

// readOnly is a /proc/sys a container without privileges sees: reads
// work, writes fail with EROFS.
type readOnly struct{ sysctl.Dir }

func (r readOnly) Ensure(name, value string) (string, error) {
	old, err := r.Get(name)
	if err != nil || old == value {
		return old, err
	}
	return old, &fs.PathError{Op: "open", Path: r.Path(name), Err: syscall.EROFS}
}

func TestProxyWarnsOncePerModeSysctlItFindsWrongAndCannotSet(t *testing.T) {
	h := modeSysctlHarness(t)
	// The init step ran for another config: arp_announce and ip_forward
	// are right, the rest is not.
	for name, v := range map[string]string{"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.arp_announce": "2"} {
		if err := os.WriteFile(sysctl.Dir(h.procSys).Path(name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h.a.sysctls = readOnly{sysctl.Dir(h.procSys)}
	path := writeFile(t, "kube-proxy.yaml", header+"mode: ipvs\nipvs: {strictARP: true}\n")
	if code := h.run("proxy", "--manifests", t.TempDir(), "--config", path); code != 0 || !h.ran {
		t.Fatalf("exit %d, ran %v:\n%s", code, h.ran, h.stderr.String())
	}
	log := h.stderr.String()
	wrong := map[string]string{"net.ipv4.vs.conntrack": "1", "net.ipv4.vs.expire_nodest_conn": "1",
		"net.ipv4.vs.expire_quiescent_template": "1", "net.ipv4.conf.all.arp_ignore": "1"}
	for name, want := range wrong {
		re := regexp.MustCompile(`(?m)^W\d{4} .*\] "a sysctl the proxy mode needs is not set and kp cannot set it" mode="ipvs" sysctl="` +
			regexp.QuoteMeta(name) + `" value="0" want="` + want + `" .*read-only file system.* fix="run kp sysctl with kp proxy's config .*init container.*`)
		if n := len(re.FindAllString(log, -1)); n != 1 {
			t.Errorf("%d warnings naming %s, its value 0, %s wanted and the fix; want 1:\n%s", n, name, want, log)
		}
	}
	if n := strings.Count(log, `"a sysctl the proxy mode needs is not set`); n != len(wrong) {
		t.Errorf("%d warnings, want %d (none for the sysctls already right):\n%s", n, len(wrong), log)
	}
	var failed int
	for _, s := range h.opts.Sysctls {
		if wrong[s.Name] != "" && s.Error != "" && s.Value == "0" {
			failed++
		}
	}
	if failed != len(wrong) {
		t.Errorf("status API sysctls %+v: want the %d wrong ones with their error", h.opts.Sysctls, len(wrong))
	}
}
