package options

import (
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

// The settings of another mode (ForMode: what a switch builds, or what
// auto tries) are the settings a kp started in that mode with the same
// flags and config file has: the mode's own defaults and its own section
// of the file, never the started mode's.
func TestSettingsForAnotherModeAreThoseOfAKpStartedInIt(t *testing.T) {
	dir := t.TempDir()
	const sections = "nftables: {masqueradeBit: 10, syncPeriod: 20s}\niptables: {masqueradeBit: 12, syncPeriod: 40s, localhostNodePorts: false}\n"
	file := writeFile(t, "kube-proxy.yaml", header+"mode: nftables\n"+sections)
	for _, c := range []struct {
		name string
		args []string
		// inFile: the mode is the file's; with --config a flag cannot
		// change it (as upstream), so a kp started in m has m in its file.
		inFile bool
	}{
		{name: "nftables by flag (NodePorts on primary IPs by default)", args: []string{"--proxy-mode", "nftables"}},
		{name: "iptables by flag", args: []string{"--proxy-mode", "iptables", "--iptables-backend", "legacy"}},
		{name: "userspace by flag, NodePort CIDRs", args: []string{"--proxy-mode", "userspace", "--nodeport-addresses", "10.0.0.0/8"}},
		{name: "nftables by flag, primary", args: []string{"--proxy-mode", "nftables", "--nodeport-addresses", "primary"}},
		{name: "nftables by the file, each mode its section", args: []string{"--config", file}, inFile: true},
		{name: "auto", args: nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			started, err := resolve(append([]string{"--manifests", dir}, c.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range Modes {
				switched, err := started.ForMode(m)
				if err != nil {
					t.Fatalf("ForMode(%s): %v", m, err)
				}
				args := append(slices.Clone(c.args), "--proxy-mode", string(m))
				if c.inFile {
					args = []string{"--config", writeFile(t, "kube-proxy-"+string(m)+".yaml", header+"mode: "+string(m)+"\n"+sections)}
				}
				direct, err := resolve(append([]string{"--manifests", dir}, args...)...)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(switched.Config, direct.Config) {
					t.Errorf("%s: ForMode gives\n%+v\nstarted in it:\n%+v", m, switched.Config, direct.Config)
				}
			}
		})
	}
}

// ForMode reads the config file as it was at start: a file changed since
// does not change a later switch's settings.
func TestSettingsForAnotherModeReadTheFileOnce(t *testing.T) {
	file := writeFile(t, "kube-proxy.yaml", header+"mode: nftables\niptables: {masqueradeBit: 12}\n")
	s, err := resolve("--manifests", t.TempDir(), "--config", file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(header+"mode: nftables\niptables: {masqueradeBit: 3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ipt, err := s.ForMode(proxy.ModeIPTables)
	if err != nil {
		t.Fatal(err)
	}
	if ipt.Config.MasqueradeBit != 12 {
		t.Errorf("iptables mode's masquerade bit %d, want 12 as the file said at start", ipt.Config.MasqueradeBit)
	}
}
