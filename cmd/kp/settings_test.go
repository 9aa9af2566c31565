package main

// kp proxy's settings as the command uses them: the logger they build, the
// ignored settings it logs, and the errors of the command rather than of
// the settings. The settings themselves are tested in package options.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// runProxyWith runs kp proxy --manifests dir args... with fake backends for
// the extra modes, and returns the Config server.Run was given.
func runProxyWith(t *testing.T, dir string, extraModes []proxy.Mode, args ...string) (proxy.Config, *harness) {
	t.Helper()
	h := newHarness(t)
	for _, m := range extraModes {
		h.a.backends[m] = (&fakeBackend{mode: m}).factory()
	}
	code := h.run(append([]string{"proxy", "--manifests", dir}, args...)...)
	if code != 0 || !h.ran {
		t.Fatalf("exit %d, ran %v, stderr:\n%s", code, h.ran, h.stderr.String())
	}
	return h.cfg, h
}

func TestIgnoredFlagsAreLogged(t *testing.T) {
	_, h := runProxyWith(t, t.TempDir(), nil, "--kube-api-qps=20", "--oom-score-adj=-999")
	for _, want := range []string{
		`] "ignoring kube-proxy setting" setting="--kube-api-qps" reason="kp sets its own API client rate limits"`,
		`setting="--oom-score-adj"`,
	} {
		if !strings.Contains(h.stderr.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, h.stderr.String())
		}
	}
}

func TestProxyFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // the whole of stderr
		code int    // failed (1), or bad usage (2) for what cobra refuses
	}{
		{"ipvs not built yet", []string{"--proxy-mode", "ipvs"},
			`kp: --proxy-mode=ipvs is not implemented yet; use nftables`, exitFailed},
		{"iptables not built yet", []string{"--proxy-mode=iptables"},
			`kp: --proxy-mode=iptables is not implemented yet; use nftables`, exitFailed},
		{"userspace not built yet", []string{"--proxy-mode", "userspace"},
			`kp: --proxy-mode=userspace is not implemented yet; use nftables`, exitFailed},
		{"malformed feature gates", []string{"--feature-gates", "NFTablesProxyMode"},
			`kp: invalid argument "NFTablesProxyMode" for "--feature-gates" flag: malformed pair, expect string=bool (see 'kp proxy --help')`, exitUsage},
		{"positional arguments", []string{"extra"},
			`kp: unknown command "extra" for "kp proxy"`, exitUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			code := h.run(append([]string{"proxy", "--manifests", t.TempDir()}, tt.args...)...)
			if code != tt.code || h.ran {
				t.Errorf("exit %d, ran %v; want exit %d before running", code, h.ran, tt.code)
			}
			if got := strings.TrimSuffix(h.stderr.String(), "\n"); got != tt.want {
				t.Errorf("stderr:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestConfigFileLoggingAppliesUnlessFlagsSetIt(t *testing.T) {
	path := writeFile(t, "kube-proxy.yaml", header+"logging: {format: json, verbosity: 4}\n")
	_, h := runProxyWith(t, t.TempDir(), nil, "--config", path)
	if !strings.Contains(h.stderr.String(), `{"ts":`) || !strings.Contains(h.stderr.String(), `"msg":"starting kp proxy"`) {
		t.Errorf("file's logging.format json not used:\n%s", h.stderr.String())
	}
	if h.a.log == nil || !h.a.log.Enabled(t.Context(), -4) {
		t.Errorf("file's logging.verbosity 4 not used")
	}

	_, h = runProxyWith(t, t.TempDir(), nil, "--config", path, "--log-format", "text", "--v", "0")
	if strings.Contains(h.stderr.String(), `{"ts":`) || h.a.log.Enabled(t.Context(), -1) {
		t.Errorf("flags did not override the file's logging:\n%s", h.stderr.String())
	}
}

func TestConfigFileIgnoredSettingsAreLogged(t *testing.T) {
	path := writeFile(t, "kube-proxy.yaml", header+"oomScoreAdj: -999\n")
	_, h := runProxyWith(t, t.TempDir(), nil, "--config", path)
	for _, want := range []string{
		fmt.Sprintf(`setting="oomScoreAdj in %s"`, path),
	} {
		if !strings.Contains(h.stderr.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, h.stderr.String())
		}
	}
}

func TestConfigFileModeNotBuiltYet(t *testing.T) {
	h := newHarness(t)
	path := writeFile(t, "kube-proxy.yaml", header+"mode: ipvs\n")
	code := h.run("proxy", "--manifests", t.TempDir(), "--config", path)
	want := "kp: mode ipvs in --config " + path + " is not implemented yet; use nftables\n"
	if code != 1 || h.stderr.String() != want {
		t.Errorf("exit %d, stderr %q, want %q", code, h.stderr.String(), want)
	}
}

func TestJSONLogFormat(t *testing.T) {
	_, h := runProxyWith(t, t.TempDir(), nil, "--log-format", "json")
	for _, line := range strings.Split(strings.TrimSpace(h.stderr.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("not JSON: %q", line)
		}
	}
}

func TestUpstreamLoggingFormatFlag(t *testing.T) {
	_, h := runProxyWith(t, t.TempDir(), nil, "--logging-format=json")
	if !strings.HasPrefix(h.stderr.String(), `{"ts":`) {
		t.Errorf("--logging-format=json not honoured:\n%s", h.stderr.String())
	}
}
