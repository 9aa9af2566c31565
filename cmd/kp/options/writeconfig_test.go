package options

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// --write-config-to writes the effective settings as a file that reads back
// into the same settings, strictly (every field upstream's, none unknown).
func TestWrittenConfigReadsBackIntoTheSameSettings(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		nil,
		{"--proxy-mode", "iptables", "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56", "--masquerade-all",
			"--iptables-masquerade-bit", "3", "--iptables-localhost-nodeports=false", "--nodeport-addresses", "10.0.0.0/8",
			"--hostname-override", "worker-1", "--conntrack-max-per-core", "0", "--conntrack-udp-timeout", "10s",
			"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0", "--feature-gates", "AllowServiceExternalIPs=false",
			"--v", "3", "--vmodule", "proxier=5", "--healthz-bind-address", "127.0.0.1:9999", "--metrics-bind-address", "0.0.0.0:9998",
			"--profiling", "--config-sync-period", "1h", "--sync-period", "1m", "--min-sync-period", "2s"},
		{"--proxy-mode", "ipvs", "--ipvs-scheduler", "sh", "--ipvs-strict-arp", "--ipvs-exclude-cidrs", "10.1.0.0/16",
			"--ipvs-tcp-timeout", "10s", "--bind-address", "::", "--logging-format", "json"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			first, err := resolve(append([]string{"--manifests", dir}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "written.yaml")
			if _, err := WriteConfig(path, first); err != nil {
				t.Fatal(err)
			}
			again, err := resolve("--manifests", dir, "--config", path)
			if err != nil {
				data, _ := os.ReadFile(path)
				t.Fatalf("the written file does not load: %v\n%s", err, data)
			}
			for _, ig := range again.Ignored {
				if ig.Warn {
					t.Errorf("the written file warns: %+v", ig)
				}
			}
			if !reflect.DeepEqual(again.Config, first.Config) || again.Conntrack != first.Conntrack || again.Log != first.Log {
				data, _ := os.ReadFile(path)
				t.Errorf("read back:\n %+v\n %+v\n %+v\nwrote:\n %+v\n %+v\n %+v\nfile:\n%s",
					again.Config, again.Conntrack, again.Log, first.Config, first.Conntrack, first.Log, data)
			}
		})
	}
}
