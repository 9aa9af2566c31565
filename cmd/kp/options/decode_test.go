package options

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/apiserver"
)

// Upstream decodes its config file strictly and, when only strictness fails,
// leniently with a warning (cmd/kube-proxy/app/options.go, loadConfig). The
// cases and their outcomes are what kube-proxy v1.36.3 did with them
// (kube-proxy --config FILE --write-config-to OUT, recorded in
// test/proofs/t33a.md): an unknown field is dropped, a duplicated field
// keeps its last value, a field in another case is unknown.
// lenientCases are files upstream decodes only leniently, with the mode
// upstream's --write-config-to wrote for each (its default: iptables).
var lenientCases = []struct {
	name, file   string
	warning      string // in the one warning logged
	want         func(*proxy.Config)
	upstreamMode string
}{
	{"an unknown field left over from an older kube-proxy", header + "udpIdleTimeout: 250ms\nmode: ipvs\n",
		`strict decoding error: unknown field "udpIdleTimeout"`,
		func(c *proxy.Config) { c.Mode, c.NodePortPrimary = proxy.ModeIPVS, false }, "ipvs"},
	{"an unknown nested field; its neighbours apply", header + "conntrack: {maxPerCore: 5, bogus: 1}\nnftables: {syncPeriod: 1m}\n",
		`unknown field "conntrack.bogus"`, func(c *proxy.Config) { c.SyncPeriod = time.Minute }, "iptables"},
	{"a duplicated field keeps its last value", header + "mode: ipvs\nmode: nftables\n",
		`line 4: key "mode" already set in map`, func(*proxy.Config) {}, "nftables"},
	{"field names are case-sensitive: another case is unknown", header + "Mode: ipvs\nclusterCidr: 10.0.0.0/8\n",
		`unknown field "Mode", unknown field "clusterCidr"`, func(*proxy.Config) {}, "iptables"},
	{"JSON: duplicated and unknown", `{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration",` +
		`"mode":"ipvs","mode":"iptables","zzz":1}`,
		`duplicate field "mode", unknown field "zzz"`,
		func(c *proxy.Config) { c.Mode, c.NodePortPrimary = proxy.ModeIPTables, false }, "iptables"},
}

func TestConfigFileDecodesLenientlyAsUpstreamDoes(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range lenientCases {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "kube-proxy.yaml", tt.file)
			s, err := resolve("--manifests", dir, "--config", path)
			if err == nil && s.Auto {
				s, err = s.ForMode(Modes[0])
			}
			if err != nil {
				t.Fatalf("kp refused the file: %v", err)
			}
			want := defaultsFor(dir)
			tt.want(&want)
			if !reflect.DeepEqual(s.Config, want) {
				t.Errorf("config:\n got %+v\nwant %+v", s.Config, want)
			}
			var warnings []IgnoredSetting
			for _, ig := range s.Ignored {
				if ig.Name == "--config "+path {
					warnings = append(warnings, ig)
				}
			}
			if len(warnings) != 1 || !warnings[0].Warn || !strings.Contains(warnings[0].Reason, tt.warning) ||
				!strings.Contains(warnings[0].Reason, "decoded leniently") {
				t.Errorf("warnings %+v, want one naming %q", warnings, tt.warning)
			}
		})
	}
}

func TestConfigFileStrictlyValidHasNoWarning(t *testing.T) {
	path := writeFile(t, "kube-proxy.yaml", kubeadmConfig)
	s, err := resolve("--manifests", t.TempDir(), "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ig := range s.Ignored {
		if ig.Warn {
			t.Errorf("kubeadm's file warns: %+v", ig)
		}
	}
}

// TestLenientCasesAreWhatUpstreamDoes runs upstream's own kube-proxy (make
// kube-bins' build of the pinned module) on the same files: each loads with
// its lenient-decoding message and the mode above, and a file that fails
// leniently too fails there as in kp.
func TestLenientCasesAreWhatUpstreamDoes(t *testing.T) {
	bin := apiserver.Bin(t, apiserver.KubeProxy)
	run := func(file string) (string, string, error) {
		dir := t.TempDir()
		in, out := filepath.Join(dir, "in.yaml"), filepath.Join(dir, "out.yaml")
		if err := os.WriteFile(in, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd := exec.Command(bin, "--config", in, "--write-config-to", out)
		cmd.Stderr = &stderr
		err := cmd.Run()
		data, _ := os.ReadFile(out)
		return string(data), stderr.String(), err
	}
	for _, tt := range lenientCases {
		written, log, err := run(tt.file)
		if err != nil || !strings.Contains(log, "Using lenient decoding as strict decoding failed") ||
			!strings.Contains(written, "\nmode: "+tt.upstreamMode+"\n") {
			t.Errorf("%s: upstream: %v, mode %q wanted; log:\n%s\nwritten:\n%s", tt.name, err, tt.upstreamMode, log, written)
		}
	}
	for _, file := range []string{header + "mode: [ipvs\n", header + "nftables: {masqueradeBit: high}\n"} {
		if _, log, err := run(file); err == nil {
			t.Errorf("upstream loads %q:\n%s", file, log)
		}
		if _, err := resolve("--manifests", t.TempDir(), "--config", writeFile(t, "kube-proxy.yaml", file)); err == nil {
			t.Errorf("kp loads %q", file)
		}
	}
}
