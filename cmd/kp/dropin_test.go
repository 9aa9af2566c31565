package main

// kp proxy as a drop-in for kube-proxy's command: what upstream does with
// its config file changing, the flags beside --config, the flags that do
// something else than proxy (--version, --write-config-to, --init-only), the
// default mode, NodeCIDR's pod CIDRs and the feature gates.

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// runningKP starts kp proxy args... in the background with a proxy loop
// that runs until it is stopped, and returns the harness and the exit code
// to come.
func runningKP(t *testing.T, args ...string) (*harness, <-chan int) {
	t.Helper()
	h := newHarness(t)
	started := make(chan struct{})
	h.runProxy = func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	code := make(chan int, 1)
	go func() { code <- h.runCtx(ctx, append([]string{"proxy"}, args...)...) }()
	select {
	case <-started:
	case c := <-code:
		t.Fatalf("kp exited %d before proxying:\n%s", c, h.stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("kp did not start proxying")
	}
	return h, code
}

func TestConfigFileChangeStopsKpAsUpstreamDoes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, path string)
	}{
		{"written in place", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(header+"mode: nftables\nclusterCIDR: 10.9.0.0/16\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"replaced as a ConfigMap volume does: a symlink swapped beside it", func(t *testing.T, path string) {
			dir := filepath.Dir(path)
			if err := os.MkdirAll(filepath.Join(dir, "..2"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "..2", "config.conf"), []byte(header+"mode: iptables\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("..2", filepath.Join(dir, "..data_tmp")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// The layout of a ConfigMap volume: config.conf -> ..data/config.conf, ..data -> ..1.
			if err := os.MkdirAll(filepath.Join(dir, "..1"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "..1", "config.conf"), []byte(header+"mode: nftables\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			for link, target := range map[string]string{"..data": "..1", "config.conf": "..data/config.conf"} {
				if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(dir, "config.conf")
			h, code := runningKP(t, "--manifests", t.TempDir(), "--config", path)
			// The same content written again is no change.
			if err := os.WriteFile(filepath.Join(dir, "..1", "config.conf"), []byte(header+"mode: nftables\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			select {
			case c := <-code:
				t.Fatalf("kp exited %d on a write of the same content:\n%s", c, h.stderr.String())
			case <-time.After(300 * time.Millisecond):
			}
			tc.change(t, path)
			select {
			case c := <-code:
				log := h.stderr.String()
				if c != 1 || !regexp.MustCompile(`(?m)^E\d{4} .*\] "the config file changed; exiting so that kp restarts with it, as kube-proxy does" file="`+regexp.QuoteMeta(path)+`" reason="content of the proxy server's configuration file was updated"$`).MatchString(log) ||
					!strings.Contains(log, "kp: --config "+path+": content of the proxy server's configuration file was updated\n") {
					t.Errorf("exit %d:\n%s", c, log)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("kp still runs 10s after its config file changed:\n%s", h.stderr.String())
			}
		})
	}
}

func TestFlagsBesideConfigAreIgnoredWithAWarning(t *testing.T) {
	path := writeFile(t, "kube-proxy.yaml", header+"clusterCIDR: 10.244.0.0/16\n")
	cfg, h := runProxyWith(t, t.TempDir(), nil, "--config", path, "--cluster-cidr", "10.9.0.0/16", "--v", "2",
		"--hostname-override", "node-b")
	if !slices.Equal(cfg.ClusterCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}) || cfg.HostnameOverride != "node-b" {
		t.Errorf("cluster CIDRs %v, node %q: want the file's, and the flag's name", cfg.ClusterCIDRs, cfg.HostnameOverride)
	}
	log := h.stderr.String()
	if !regexp.MustCompile(`(?m)^W\d{4} .*\] "ignoring kube-proxy setting" setting="--cluster-cidr=10.9.0.0/16" reason="--config is set, and kube-proxy ignores this flag then: set it in the file"$`).MatchString(log) {
		t.Errorf("no warning for the ignored flag:\n%s", log)
	}
	if strings.Contains(log, `setting="--v=`) || strings.Contains(log, `setting="--hostname-override`) {
		t.Errorf("a flag in force beside --config is reported ignored:\n%s", log)
	}
}

func TestVersionFlagPrintsTheVersionAndExits(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--version", "kp v9.9.9-test\n"},
		{"--version=raw", "kp version v9.9.9-test\ngit commit: abc123\n"},
	} {
		h := newHarness(t)
		if code := h.run("proxy", tc.arg); code != 0 || h.ran || !strings.HasPrefix(h.stdout.String(), tc.want) {
			t.Errorf("kp proxy %s: exit %d, ran %v, stdout %q, want %q", tc.arg, code, h.ran, h.stdout.String(), tc.want)
		}
	}
}

func TestWriteConfigToWritesTheEffectiveConfigurationAndExits(t *testing.T) {
	h := newHarness(t)
	out := filepath.Join(t.TempDir(), "written.yaml")
	code := h.run("proxy", "--manifests", t.TempDir(), "--proxy-mode", "nftables", "--cluster-cidr", "10.1.0.0/16",
		"--write-config-to", out)
	data, err := os.ReadFile(out)
	if code != 0 || h.ran || err != nil {
		t.Fatalf("exit %d, ran %v, %v:\n%s", code, h.ran, err, h.stderr.String())
	}
	for _, want := range []string{"apiVersion: kubeproxy.config.k8s.io/v1alpha1\n", "\nkind: KubeProxyConfiguration\n",
		"\nmode: nftables\n", "\nclusterCIDR: 10.1.0.0/16\n", "\nnodePortAddresses:\n- primary\n"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("written file lacks %q:\n%s", want, data)
		}
	}
	if !strings.Contains(h.stderr.String(), `"Wrote configuration" file="`+out+`"`) ||
		!strings.Contains(h.stderr.String(), `settings="--manifests"`) {
		t.Errorf("log:\n%s", h.stderr.String())
	}
}

func TestInitOnlySetsTheSysctlsAndExits(t *testing.T) {
	h := newHarness(t)
	if code := h.run("proxy", "--manifests", t.TempDir(), "--init-only"); code != 0 || h.ran {
		t.Fatalf("exit %d, ran %v:\n%s", code, h.ran, h.stderr.String())
	}
	if got := sysctlValues(t, h.procSys); got["nf_conntrack_tcp_timeout_close_wait"] != "3600" || got["nf_conntrack_max"] != "131072" {
		t.Errorf("after --init-only: %v", got)
	}
}

func TestEmptyModeWarnsWhatDiffersFromKubeProxy(t *testing.T) {
	_, h := runProxyWith(t, t.TempDir(), nil)
	warning := regexp.MustCompile(`(?m)^W\d{4} .*\] "no proxy mode set \(mode: \\"\\" in the config file, no --proxy-mode\): kube-proxy runs iptables mode then, kp runs the first mode this node supports" mode="nftables" kube-proxy="iptables mode: KUBE-\* iptables chains; answers NodePorts on every local IP \(and 127.0.0.1, localhostNodePorts\)" kp="nftables mode: answers NodePorts on the node's primary IPs only`)
	if n := len(warning.FindAllString(h.stderr.String(), -1)); n != 1 {
		t.Errorf("%d warnings about the default mode, want 1:\n%s", n, h.stderr.String())
	}
	for _, args := range [][]string{{"--proxy-mode", "nftables"}, {"--config", writeFile(t, "kube-proxy.yaml", header+"mode: nftables\n")}} {
		_, h := runProxyWith(t, t.TempDir(), nil, args...)
		if strings.Contains(h.stderr.String(), "no proxy mode set") {
			t.Errorf("%v: warns though the mode is set:\n%s", args, h.stderr.String())
		}
	}
}

func TestFeatureGatesUpstreamKnowsAreAcceptedAndTheIgnoredLoggedOnce(t *testing.T) {
	path := writeFile(t, "kube-proxy.yaml", header+"featureGates: {APIResponseCompression: true, AllowServiceExternalIPs: false}\n")
	cfg, h := runProxyWith(t, t.TempDir(), nil, "--config", path)
	if !cfg.IgnoreExternalIPs {
		t.Error("AllowServiceExternalIPs=false not honoured")
	}
	log := h.stderr.String()
	if n := strings.Count(log, `"ignoring kube-proxy setting" setting="feature gate APIResponseCompression=true" reason="no part of kp depends on it"`); n != 1 {
		t.Errorf("the ignored gate logged %d times:\n%s", n, log)
	}
	if strings.Contains(log, "AllowServiceExternalIPs=false\" reason") {
		t.Errorf("a gate kp honours is logged as ignored:\n%s", log)
	}
}

func TestNodeCIDRDetectionReadsTheNodesPodCIDRsAndStopsWhenTheyChange(t *testing.T) {
	dir := t.TempDir()
	node := `apiVersion: v1
kind: Node
metadata: {name: node-a.example}
spec: {podCIDR: 10.244.1.0/24, podCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]}
`
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), []byte(node), 0o644); err != nil {
		t.Fatal(err)
	}
	h, code := runningKP(t, "--manifests", dir, "--detect-local-mode", "NodeCIDR")
	want := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
	if !slices.Equal(h.cfg.DetectLocal.PodCIDRs, want) || !slices.Equal(h.cfg.LocalCIDRs(), want) {
		t.Errorf("pod CIDRs %v, local CIDRs %v, want %v", h.cfg.DetectLocal.PodCIDRs, h.cfg.LocalCIDRs(), want)
	}
	var watch proxy.SyncObserver
	for _, o := range h.opts.Observers {
		if w, ok := o.(*podCIDRWatch); ok {
			watch = w
		}
	}
	if watch == nil {
		t.Fatal("no observer of the pod CIDRs")
	}
	same := &proxy.State{Node: proxy.Node{Name: "node-a.example", PodCIDRs: want}}
	watch.Synced(t.Context(), nil, same)
	select {
	case c := <-code:
		t.Fatalf("exit %d with the same pod CIDRs", c)
	case <-time.After(100 * time.Millisecond):
	}
	watch.Synced(t.Context(), same, &proxy.State{Node: proxy.Node{Name: "node-a.example", PodCIDRs: want[:1]}})
	select {
	case c := <-code:
		if c != 1 || !strings.Contains(h.stderr.String(), "kp: detectLocalMode NodeCIDR: node node-a.example's pod CIDRs changed from 10.244.1.0/24,fd00:10:244:1::/64 to 10.244.1.0/24") {
			t.Errorf("exit %d:\n%s", c, h.stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kp still runs after the pod CIDRs changed")
	}
}

func TestNodeCIDRDetectionWithoutPodCIDRsFails(t *testing.T) {
	h := newHarness(t)
	code := h.run("proxy", "--manifests", t.TempDir(), "--detect-local-mode", "NodeCIDR")
	if code != 1 || h.ran || !strings.Contains(h.stderr.String(), `detectLocalMode NodeCIDR: no Node "node-a.example" with spec.podCIDRs`) {
		t.Errorf("exit %d, ran %v:\n%s", code, h.ran, h.stderr.String())
	}
}
