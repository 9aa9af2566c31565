package options

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

// FuzzConfigFile hands arbitrary bytes to kp as its --config file (a
// KubeProxyConfiguration) and resolves the settings as kp's start does.
// Nothing may panic; the result is either an error naming the file (or, for a check
// across settings, the flag of the setting at fault) or
// settings kp can run with (a known mode, a mark bit within [0, 31], sync
// periods that make sense); and the same file resolves the same way twice
// (no map order in values or messages). Seeds: the committed corpus
// (testdata/fuzz/FuzzConfigFile).
func FuzzConfigFile(f *testing.F) {
	f.Add([]byte(kubeadmConfig))
	f.Add([]byte(header + "mode: ipvs\nipvs: {scheduler: mh, excludeCIDRs: [10.1.0.0/16]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "kube-proxy.yaml")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		manifests := t.TempDir()
		s, err := resolve("--manifests", manifests, "--config", path)
		again, err2 := resolve("--manifests", manifests, "--config", path)
		s.ForMode, again.ForMode = nil, nil // a func: never DeepEqual
		if (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() || err == nil && !reflect.DeepEqual(s, again) {
			t.Fatalf("the same file resolved twice differs:\n%v\n%+v\nthen\n%v\n%+v", err, s, err2, again)
		}
		if err != nil {
			// Each line names the file, or the setting at fault by its
			// flag: the checks across settings (finish) run on the merged
			// result, file and flags together.
			if !strings.Contains(err.Error(), path) && !strings.HasPrefix(err.Error(), "--") {
				t.Fatalf("the error names neither the file %s nor a setting: %v", path, err)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if strings.HasPrefix(line, "--config") && !strings.Contains(line, path) {
					t.Fatalf("an error of --config does not name the file %s: %q", path, line)
				}
			}
			return
		}
		checkRunnable(t, s.Config)
	})
}

// checkRunnable fails t unless c is settings kp can start with.
func checkRunnable(t *testing.T, c proxy.Config) {
	t.Helper()
	switch c.Mode {
	case proxy.ModeNFTables, proxy.ModeIPTables, proxy.ModeIPVS, proxy.ModeUserspace:
	default:
		t.Fatalf("accepted mode %q", c.Mode)
	}
	if _, err := c.MasqueradeMark(); err != nil {
		t.Fatalf("accepted masqueradeBit %d: %v", c.MasqueradeBit, err)
	}
	if c.SyncPeriod <= 0 || c.MinSyncPeriod < 0 || c.ConfigSyncPeriod < 0 {
		t.Fatalf("accepted sync periods %v, min %v, config %v", c.SyncPeriod, c.MinSyncPeriod, c.ConfigSyncPeriod)
	}
	for _, p := range append(append(c.ClusterCIDRs, c.NodePortAddresses...), c.IPVS.ExcludeCIDRs...) {
		if !p.IsValid() {
			t.Fatalf("accepted an invalid CIDR in %+v", c)
		}
	}
	if c.HostnameOverride == "" || c.HostnameOverride != strings.ToLower(strings.TrimSpace(c.HostnameOverride)) {
		t.Fatalf("accepted node name %q", c.HostnameOverride)
	}
}
