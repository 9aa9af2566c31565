package options

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/apiserver"
)

// upstreamSample is a value for each upstream flag that, when kube-proxy
// applies the flag, shows in the configuration it writes.
var upstreamSample = map[string]string{
	"bind-address": "::", "bind-address-hard-fail": "true", "cluster-cidr": "10.0.0.0/8", "config-sync-period": "1h7m",
	"conntrack-max-per-core": "7", "conntrack-min": "7", "conntrack-tcp-be-liberal": "true",
	"conntrack-tcp-timeout-close-wait": "1h7m", "conntrack-tcp-timeout-established": "1h7m",
	"conntrack-udp-timeout": "1h7m", "conntrack-udp-timeout-stream": "1h7m", "detect-local-mode": "NodeCIDR",
	"feature-gates": "APIResponseCompression=false", "healthz-bind-address": "1.2.3.4:5", "healthz-port": "7",
	"hostname-override": "flaghost", "iptables-localhost-nodeports": "false", "iptables-masquerade-bit": "7",
	"iptables-min-sync-period": "7s", "iptables-sync-period": "1h7m", "ipvs-exclude-cidrs": "10.0.0.0/8",
	"ipvs-min-sync-period": "7s", "ipvs-scheduler": "sh", "ipvs-strict-arp": "true", "ipvs-sync-period": "1h7m",
	"ipvs-tcp-timeout": "7s", "ipvs-tcpfin-timeout": "7s", "ipvs-udp-timeout": "7s", "kube-api-burst": "7",
	"kube-api-content-type": "application/json", "kube-api-qps": "7", "kubeconfig": "/flag.kubeconfig",
	"log-flush-frequency": "7s", "log-json-info-buffer-size": "1Ki", "log-json-split-stream": "true",
	"log-text-info-buffer-size": "1Ki", "log-text-split-stream": "true", "logging-format": "json",
	"masquerade-all": "true", "metrics-bind-address": "1.2.3.4:5", "metrics-port": "7", "nodeport-addresses": "10.0.0.0/8",
	"oom-score-adj": "7", "pod-bridge-interface": "cbr7", "pod-interface-name-prefix": "veth7", "profiling": "true",
	"proxy-mode": "ipvs", "show-hidden-metrics-for-version": "1.35", "v": "7", "vmodule": "x=7",
}

// upstreamWithoutField are the upstream flags with no field in the file:
// what they do is not in --write-config-to's output.
var upstreamWithoutField = []string{"config", "write-config-to", "cleanup", "init-only", "version", "help", "master",
	"boot-id-file", "machine-id-file"}

// TestFlagsInForceBesideConfigAreUpstreams asks upstream's own kube-proxy
// (make kube-bins' build of the pinned module) which flags it applies beside
// --config: for each flag, it writes its effective configuration
// (--write-config-to, which exits before touching the node) with and
// without the flag; kp's rule (inForceWithConfig) must give the same answer
// for every flag.
func TestFlagsInForceBesideConfigAreUpstreams(t *testing.T) {
	bin := apiserver.Bin(t, apiserver.KubeProxy)
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte(header+"featureGates: {LoggingAlphaOptions: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	written := func(args ...string) []byte {
		out := filepath.Join(t.TempDir(), "out.yaml")
		cmd := exec.Command(bin, append([]string{"--config", config, "--write-config-to", out}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("kube-proxy %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	base := written()
	for _, name := range UpstreamFlags(false) {
		if slices.Contains(upstreamWithoutField, name) {
			if !inForceWithConfig(name) {
				t.Errorf("--%s: kp ignores it beside --config; it has no field in the file, so upstream cannot", name)
			}
			continue
		}
		v, ok := upstreamSample[name]
		if !ok {
			t.Errorf("--%s: upstream flag without a sample value here: add one", name)
			continue
		}
		upstreamApplies := !bytes.Equal(written("--"+name+"="+v), base)
		if upstreamApplies != inForceWithConfig(name) {
			t.Errorf("--%s=%s beside --config: upstream applies it: %t, kp: %t", name, v, upstreamApplies, inForceWithConfig(name))
		}
	}
}
