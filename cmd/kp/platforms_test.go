package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
)

// platformsDir holds kube-proxy as real platforms deploy it (README.md
// there names each source and version).
const platformsDir = "options/testdata/platforms"

// platform is one way kube-proxy is deployed: its command line, and the
// files it reads (the ConfigMap keys its --config names, through the pod's
// volumes).
type platform struct {
	args  []string          // after the program's name
	files map[string]string // path in the pod → content
}

// readPlatform reads a platform's manifests: a DaemonSet or a static Pod
// whose kube-proxy container runs kube-proxy (directly or through sh -c
// "exec kube-proxy ..."), and the ConfigMaps its volumes mount; or, for a
// .txt file, the arguments alone, one per line.
func readPlatform(t *testing.T, name string) platform {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(platformsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(name, ".txt") {
		var p platform
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				p.args = append(p.args, l)
			}
		}
		return p
	}
	configMaps := map[string]map[string]string{}
	var pod *v1.PodSpec
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		switch meta.Kind {
		case "ConfigMap":
			var cm v1.ConfigMap
			mustUnmarshal(t, doc, &cm)
			configMaps[cm.Name] = cm.Data
		case "DaemonSet":
			var ds appsv1.DaemonSet
			mustUnmarshal(t, doc, &ds)
			pod = &ds.Spec.Template.Spec
		case "Pod":
			var p v1.Pod
			mustUnmarshal(t, doc, &p)
			pod = &p.Spec
		}
	}
	if pod == nil || len(pod.Containers) != 1 {
		t.Fatalf("%s: no pod with one container", name)
	}
	c := pod.Containers[0]
	p := platform{args: commandOf(t, c.Command), files: map[string]string{}}
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			for key, content := range configMaps[v.ConfigMap.Name] {
				p.files[filepath.Join(m.MountPath, key)] = content
			}
		}
	}
	return p
}

func mustUnmarshal(t *testing.T, doc string, into any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(doc), into); err != nil {
		t.Fatal(err)
	}
}

// commandOf is kube-proxy's arguments in a container's command.
func commandOf(t *testing.T, command []string) []string {
	t.Helper()
	if len(command) == 3 && command[0] == "/bin/sh" && command[1] == "-c" {
		_, rest, ok := strings.Cut(command[2], "exec kube-proxy ")
		if !ok {
			t.Fatalf("sh -c %q does not exec kube-proxy", command[2])
		}
		var args []string
		for _, f := range strings.Fields(rest) {
			if strings.HasPrefix(f, "1>") || strings.HasPrefix(f, "2>") {
				break
			}
			args = append(args, f)
		}
		return args
	}
	if len(command) == 0 || filepath.Base(command[0]) != "kube-proxy" {
		t.Fatalf("command %q does not run kube-proxy", command)
	}
	return command[1:]
}

// Each platform's kube-proxy, its arguments and files as they are, run as
// kp (the image's kube-proxy is kp): it starts with no error, acts on what
// the platform set, and logs every setting it does not act on, naming it,
// and the default mode's difference. kp migrate cluster's reading of the
// same command line and file (the preflight) makes the same mode.
func TestPlatformsKubeProxyConfigurationsLoadAndEveryDifferenceIsLogged(t *testing.T) {
	ignoring := func(level, setting, reason string) string {
		return `(?m)^` + level + `\d{4} .*\] "ignoring kube-proxy setting" setting="` + setting + `" reason="` + reason
	}
	for _, tc := range []struct {
		file string
		mode proxy.Mode
		// logged are the log lines kp must write (regular expressions).
		logged []string
		check  func(c proxy.Config) string
	}{
		{file: "kubeadm-v1.36.yaml", mode: proxy.ModeNFTables,
			logged: []string{`(?m)^W\d{4} .*\] "no proxy mode set \(mode: \\"\\" in the config file, no --proxy-mode\): kube-proxy runs iptables mode then`},
			check: func(c proxy.Config) string {
				return fmt.Sprint(c.ClusterCIDRs, c.Kubeconfig, c.HealthzBindAddress, c.MetricsBindAddress)
			}},
		{file: "eks.yaml", mode: proxy.ModeIPTables,
			logged: []string{
				ignoring("W", `--config [^"]*/config`, `strict decoding error: unknown field \\"udpIdleTimeout\\"; decoded leniently, as kube-proxy does`),
				ignoring("I", `clientConnection.qps/burst/contentType in [^"]*`, "kp sets its own API client rate limits"),
				ignoring("I", `oomScoreAdj in [^"]*`, "kp does not change its own OOM score"),
			},
			check: func(c proxy.Config) string {
				return fmt.Sprint(c.ClusterCIDRs, c.Kubeconfig, c.HealthzBindAddress, c.MetricsBindAddress, c.SyncPeriod, c.MasqueradeBit, c.ConfigSyncPeriod)
			}},
		{file: "gke-static-pod.yaml", mode: proxy.ModeIPTables,
			logged: []string{ignoring("I", "--oom-score-adj", "kp does not change its own OOM score")},
			check: func(c proxy.Config) string {
				return fmt.Sprint(c.ClusterCIDRs, c.Master, c.Kubeconfig, c.SyncPeriod, c.MinSyncPeriod)
			}},
		{file: "k3s-args.txt", mode: proxy.ModeIPTables,
			check: func(c proxy.Config) string {
				return fmt.Sprint(c.ClusterCIDRs, c.Kubeconfig, c.HealthzBindAddress, c.HostnameOverride)
			}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			p := readPlatform(t, tc.file)
			h := newHarness(t)
			for _, m := range options.Modes {
				h.a.backends[m] = (&fakeBackend{mode: m}).factory()
			}
			args := []string{"/usr/local/bin/kube-proxy"}
			var configFile string
			for _, a := range p.args {
				a = strings.ReplaceAll(a, "$(NODE_NAME)", "node-1")
				if path, ok := strings.CutPrefix(a, "--config="); ok {
					content, ok := p.files[path]
					if !ok {
						t.Fatalf("--config %s: no ConfigMap key mounted there (files %v)", path, p.files)
					}
					configFile = writeFile(t, filepath.Base(path), content)
					a = "--config=" + configFile
				}
				args = append(args, a)
			}
			code := run(t.Context(), h.a, args)
			log := h.stderr.String()
			if code != 0 || !h.ran {
				t.Fatalf("kp %q: exit %d, ran %v:\n%s", args[1:], code, h.ran, log)
			}
			if h.cfg.Mode != tc.mode {
				t.Errorf("mode %s, want %s", h.cfg.Mode, tc.mode)
			}
			if regexp.MustCompile(`(?m)^E\d{4}`).MatchString(log) {
				t.Errorf("errors logged:\n%s", log)
			}
			for _, re := range tc.logged {
				if !regexp.MustCompile(re).MatchString(log) {
					t.Errorf("log lacks %s:\n%s", re, log)
				}
			}
			if n := strings.Count(log, `"ignoring kube-proxy setting"`); n != len(tc.logged)-boolInt(tc.mode == proxy.ModeNFTables) {
				t.Errorf("%d settings logged as ignored, want exactly the ones listed:\n%s", n, log)
			}
			t.Logf("kp %q runs %s: %s", args[1:], h.cfg.Mode, tc.check(h.cfg))
			preflightMode(t, p.args, configFile, tc.mode)
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// preflightMode reads the command line (and the file --config names) as
// kp migrate cluster reads a kube-proxy DaemonSet's, and checks the mode
// kp would run there.
func preflightMode(t *testing.T, args []string, configFile string, want proxy.Mode) {
	t.Helper()
	a, err := options.ParseKubeProxyArgs(args)
	if err != nil {
		t.Fatalf("kp migrate's reading: %v", err)
	}
	kc, lenient := a.Flags, []options.IgnoredSetting(nil)
	if a.ConfigFile != "" {
		data, err := os.ReadFile(configFile)
		if err != nil {
			t.Fatal(err)
		}
		if kc, lenient, err = options.DecodeKubeProxyConfiguration(data, "ConfigMap"); err != nil {
			t.Fatalf("kp migrate's reading: %v", err)
		}
	}
	s, err := options.SettingsFromConfig(kc, lenient, "the platform", proxy.Target{Mode: want})
	if err != nil {
		t.Fatalf("kp migrate's reading: %v", err)
	}
	if s.Config.Mode != want {
		t.Errorf("kp migrate's reading: mode %s, want %s", s.Config.Mode, want)
	}
}
