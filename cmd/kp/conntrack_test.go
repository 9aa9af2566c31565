package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kpproxy/kp/internal/sysctl"
)

// sysctlValues reads the fake /proc/sys's conntrack values, by short name.
func sysctlValues(t *testing.T, procSys string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range []string{"nf_conntrack_max", "nf_conntrack_tcp_timeout_established", "nf_conntrack_tcp_timeout_close_wait",
		"nf_conntrack_tcp_be_liberal", "nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"} {
		b, err := os.ReadFile(filepath.Join(procSys, "net", "netfilter", name))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = strings.TrimSpace(string(b))
	}
	b, err := os.ReadFile(filepath.Join(procSys, "module", "nf_conntrack", "parameters", "hashsize"))
	if err != nil {
		t.Fatal(err)
	}
	out["hashsize"] = strings.TrimSpace(string(b))
	return out
}

func TestConntrackSysctlsFollowUpstreamsFlagsAndConfig(t *testing.T) {
	// The fake kernel (fakeProcSys, 4 CPUs): max 262144, hash 65536,
	// established 432000, close_wait 60, be_liberal 0, udp 30, stream 120.
	tests := []struct {
		name string
		args []string
		file string
		// want holds the values that change; every other stays.
		want map[string]string
	}{
		{name: "upstream's defaults: max per core × 4 CPUs floored at min, hash a quarter, TCP timeouts",
			want: map[string]string{"nf_conntrack_max": "131072",
				"nf_conntrack_tcp_timeout_established": "86400", "nf_conntrack_tcp_timeout_close_wait": "3600"}},
		{name: "a bigger table grows the hash",
			args: []string{"--conntrack-max-per-core", "131072", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"},
			want: map[string]string{"nf_conntrack_max": "524288", "hashsize": "131072"}},
		{name: "zeros leave every value",
			args: []string{"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"},
			want: map[string]string{}},
		{name: "every flag",
			args: []string{"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=2h", "--conntrack-tcp-timeout-close-wait=30m",
				"--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=45s", "--conntrack-udp-timeout-stream=3m"},
			want: map[string]string{"nf_conntrack_tcp_timeout_established": "7200", "nf_conntrack_tcp_timeout_close_wait": "1800",
				"nf_conntrack_tcp_be_liberal": "1", "nf_conntrack_udp_timeout": "45", "nf_conntrack_udp_timeout_stream": "180"}},
		{name: "the config file's conntrack section",
			file: "conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 2h, tcpBeLiberal: true, udpTimeout: 10s}\n",
			want: map[string]string{"nf_conntrack_tcp_timeout_established": "86400", "nf_conntrack_tcp_timeout_close_wait": "7200",
				"nf_conntrack_tcp_be_liberal": "1", "nf_conntrack_udp_timeout": "10"}},
		{name: "beside the file, a flag is ignored, as upstream ignores it",
			file: "conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 2h}\n",
			args: []string{"--conntrack-tcp-timeout-close-wait=10m"},
			want: map[string]string{"nf_conntrack_tcp_timeout_established": "86400", "nf_conntrack_tcp_timeout_close_wait": "7200"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.file != "" {
				args = append(args, "--config", writeFile(t, "kube-proxy.yaml", header+tt.file))
			}
			_, h := runProxyWith(t, t.TempDir(), nil, args...)
			want := sysctlValues(t, fakeProcSys(t)) // the untouched kernel
			for k, v := range tt.want {
				want[k] = v
			}
			got := sysctlValues(t, h.procSys)
			for k := range want {
				if got[k] != want[k] {
					t.Errorf("%s = %s, want %s\n%s", k, got[k], want[k], h.stderr.String())
				}
			}
			// Each change is logged old → new, and the status API gets
			// every setting made.
			if n := strings.Count(h.stderr.String(), `] "set conntrack sysctl"`); n != len(tt.want) {
				t.Errorf("%d changes logged, want %d:\n%s", n, len(tt.want), h.stderr.String())
			}
			for _, s := range h.opts.Sysctls {
				if s.Error != "" || s.Value != s.Want {
					t.Errorf("status reports %+v", s)
				}
			}
		})
	}
}

func TestConntrackSysctlThatCannotBeWrittenIsAWarningNotAnExit(t *testing.T) {
	h := newHarness(t)
	// A sysctl that is a folder cannot be read or written, as a read-only
	// /proc/sys cannot be written by a process without privileges.
	path := filepath.Join(h.procSys, "net", "netfilter", "nf_conntrack_tcp_timeout_close_wait")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if code := h.run("proxy", "--manifests", t.TempDir()); code != 0 || !h.ran {
		t.Fatalf("exit %d, ran %v:\n%s", code, h.ran, h.stderr.String())
	}
	log := h.stderr.String()
	if !regexp.MustCompile(`(?m)^W\d{4} .*\] "cannot set a conntrack sysctl; kp goes on with the kernel's value" sysctl="net.netfilter.nf_conntrack_tcp_timeout_close_wait"`).MatchString(log) ||
		!strings.Contains(log, "writable /proc/sys") {
		t.Errorf("no warning naming the sysctl and the fix:\n%s", log)
	}
	var reported bool
	for _, s := range h.opts.Sysctls {
		if s.Name == "net.netfilter.nf_conntrack_tcp_timeout_close_wait" && s.Error != "" && s.Want == "3600" {
			reported = true
		}
	}
	if !reported {
		t.Errorf("status lacks the failed sysctl: %+v", h.opts.Sysctls)
	}
}

func TestSysctlCommandSetsWhatProxyWouldAndExits(t *testing.T) {
	h := newHarness(t)
	path := writeFile(t, "kube-proxy.yaml", header+"conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 1h, udpTimeout: 1m}\n")
	if code := h.run("sysctl", "--config", path); code != 0 || h.ran {
		t.Fatalf("exit %d, proxy ran %v:\n%s", code, h.ran, h.stderr.String())
	}
	got := sysctlValues(t, h.procSys)
	if got["nf_conntrack_tcp_timeout_close_wait"] != "3600" || got["nf_conntrack_udp_timeout"] != "60" || got["nf_conntrack_max"] != "262144" {
		t.Errorf("after kp sysctl: %v", got)
	}
	// Flow accounting, which kp proxy turns on itself when it can: the
	// init step turns it on for a kp proxy whose /proc/sys is read-only.
	for _, name := range []string{"net.netfilter.nf_conntrack_acct", "net.netfilter.nf_conntrack_timestamp"} {
		if v, err := sysctl.Dir(h.procSys).Get(name); v != "1" || err != nil {
			t.Errorf("after kp sysctl: %s = %q, %v; want 1", name, v, err)
		}
		if !strings.Contains(h.stderr.String(), `sysctl="`+name+`" old="0" new="1"`) {
			t.Errorf("kp sysctl did not log turning on %s:\n%s", name, h.stderr.String())
		}
	}
	if code := h.run("sysctl", "--conntrack-udp-timeout=500ms"); code != 1 ||
		!strings.Contains(h.stderr.String(), "--conntrack-udp-timeout 500ms: must be 0 (leave the kernel's value) or at least 1s") {
		t.Errorf("a sub-second timeout: exit %d:\n%s", code, h.stderr.String())
	}
}
