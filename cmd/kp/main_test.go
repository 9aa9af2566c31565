package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/internal/sysctl"
	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/server"
	"github.com/kpproxy/kp/proxy/source"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// fakeBackend records what kp asked of a mode.
type fakeBackend struct {
	mode       proxy.Mode
	cfg        proxy.Config
	probeErr   error
	cleanupErr error
	cleanups   int
}

func (b *fakeBackend) Mode() proxy.Mode                         { return b.mode }
func (b *fakeBackend) Probe(context.Context) error              { return b.probeErr }
func (b *fakeBackend) Sync(context.Context, *proxy.State) error { return nil }
func (b *fakeBackend) Cleanup(context.Context) error            { b.cleanups++; return b.cleanupErr }
func (b *fakeBackend) factory() backendFactory                  { return b.newBackend }
func (b *fakeBackend) newBackend(cfg proxy.Config, _ *slog.Logger) (proxy.Backend, error) {
	b.cfg = cfg
	return b, nil
}

// harness is an app whose kernel, host and proxy loop are fakes.
type harness struct {
	a              *app
	stdout, stderr bytes.Buffer
	nft            *fakeBackend
	env            map[string]string
	kubeCalls      []string // "kubeconfig|master" per client built
	ran            bool     // runProxy was called
	cfg            proxy.Config
	sources        []proxy.Source
	opts           server.RunOptions
	runProxy       func(ctx context.Context) error
	// procSys is the folder the app's conntrack tuner writes to instead
	// of /proc/sys (the unit tests run in the host's namespace).
	procSys string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{nft: &fakeBackend{mode: proxy.ModeNFTables}, env: map[string]string{}}
	h.a = newApp(&h.stdout, &h.stderr)
	h.a.version, h.a.commit, h.a.date = "v9.9.9-test", "abc123", "2026-11-20T10:00:00Z"
	h.a.hostname = func() (string, error) { return " Node-A.Example ", nil }
	h.a.getenv = func(k string) string { return h.env[k] }
	h.a.backends = map[proxy.Mode]backendFactory{proxy.ModeNFTables: h.nft.factory()}
	h.procSys = fakeProcSys(t)
	h.a.tuner = conntrack.Tuner{ProcSys: h.procSys, SysModule: filepath.Join(h.procSys, "module"), NumCPU: func() int { return 4 }}
	h.a.sysctls = sysctl.Dir(h.procSys)
	h.a.newKubeClient = func(kubeconfig, master string) (kubeclient.Interface, error) {
		h.kubeCalls = append(h.kubeCalls, kubeconfig+"|"+master)
		return nil, nil
	}
	h.a.runProxy = func(ctx context.Context, cfg proxy.Config, opts server.RunOptions) error {
		h.ran, h.cfg, h.sources, h.opts = true, cfg, opts.Sources, opts
		if h.runProxy != nil {
			return h.runProxy(ctx)
		}
		return nil
	}
	return h
}

// run runs kp with args and returns its exit code.
func (h *harness) run(args ...string) int {
	return h.runCtx(context.Background(), args...)
}

func (h *harness) runCtx(ctx context.Context, args ...string) int {
	return run(ctx, h.a, append([]string{"kp"}, args...))
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestHelpOfEveryCommandShowsAnExample(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"proxy", "--help"}, {"cleanup", "--help"}, {"version", "--help"}, {"flows", "--help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			h := newHarness(t)
			if code := h.run(args...); code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
			}
			out := h.stdout.String()
			if !strings.Contains(out, "Examples:\n  ") || !strings.Contains(out, "  kp ") {
				t.Errorf("help has no example:\n%s", out)
			}
		})
	}
}

// TestProxyHelpListsEveryUpstreamFlag holds kp proxy --help to upstream
// kube-proxy's: every flag upstream's --help lists (options.UpstreamFlags,
// generated from the pinned k8s.io/kubernetes module and checked against it
// by TestUpstreamFactsAreThePinnedModules) is listed, and every flag
// upstream accepts, the hidden deprecated ones too, parses.
func TestProxyHelpListsEveryUpstreamFlag(t *testing.T) {
	h := newHarness(t)
	if code := h.run("proxy", "--help"); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr.String())
	}
	help := h.stdout.String()
	listed := options.UpstreamFlags(true)
	if len(listed) < 50 {
		t.Fatalf("only %d upstream flags listed: %v", len(listed), listed)
	}
	for _, name := range listed {
		if !regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(name) + `[ =\[]`).MatchString(help) {
			t.Errorf("kp proxy --help does not list upstream's --%s", name)
		}
	}
	cmd := newRootCommand(newApp(io.Discard, io.Discard))
	proxyCmd, _, err := cmd.Find([]string{"proxy"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range options.UpstreamFlags(false) {
		if proxyCmd.Flags().Lookup(name) == nil && proxyCmd.InheritedFlags().Lookup(name) == nil && name != "help" {
			t.Errorf("kp proxy has no flag --%s", name)
		}
	}
	// kp's own, still there.
	for _, flag := range []string{"--manifests", "--log-format", "--sync-period", "--service-cidrs"} {
		if !strings.Contains(help, flag) {
			t.Errorf("proxy --help does not mention %s", flag)
		}
	}
}

func TestVersionPrintsVersionCommitAndGo(t *testing.T) {
	h := newHarness(t)
	if code := h.run("version"); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr.String())
	}
	for _, want := range []string{"kp version v9.9.9-test", "git commit: abc123", "build date: 2026-11-20T10:00:00Z", "go version: go"} {
		if !strings.Contains(h.stdout.String(), want) {
			t.Errorf("version output lacks %q:\n%s", want, h.stdout.String())
		}
	}
}

func TestVersionFromGoInstallsModuleVersion(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "4746c90bd29f7a2b1c0d"}}
	for _, tc := range []struct {
		name                    string
		version, commit         string
		mod                     string
		settings                []debug.BuildSetting
		wantVersion, wantCommit string
	}{
		{"stamped by the Makefile", "v1.2.3", "abc", "v0.0.0-20261127081500-4746c90bd29f", nil, "v1.2.3", "abc"},
		{"go install of a release", "dev", "dev", "v1.2.3", nil, "v1.2.3", "dev"},
		{"go install of a pseudo-version", "dev", "dev", "v0.0.0-20261127081500-4746c90bd29f", nil, "v0.0.0-20261127081500-4746c90bd29f", "4746c90bd29f"},
		{"go install of a pre-release pseudo-version", "dev", "dev", "v1.2.4-0.20261127081500-4746c90bd29f", nil, "v1.2.4-0.20261127081500-4746c90bd29f", "4746c90bd29f"},
		{"a tag with a suffix is no pseudo-version", "dev", "dev", "v1.2.3-rc1", nil, "v1.2.3-rc1", "dev"},
		{"go build in a checkout", "dev", "dev", "(devel)", vcs, "dev", "4746c90bd29f7a2b1c0d"},
		{"go build without VCS stamping", "dev", "dev", "(devel)", nil, "dev", "dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/kpproxy/kp", Version: tc.mod}, Settings: tc.settings}
			v, c := moduleVersion(tc.version, tc.commit, info)
			if v != tc.wantVersion || c != tc.wantCommit {
				t.Errorf("moduleVersion(%q, %q, %q) = %q, %q; want %q, %q", tc.version, tc.commit, tc.mod, v, c, tc.wantVersion, tc.wantCommit)
			}
		})
	}
}

func TestVersionJSONIsTheBuildTheProxyReports(t *testing.T) {
	h := newHarness(t)
	if code := h.run("version", "-o", "json"); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr.String())
	}
	var got statusapi.Build
	if err := json.Unmarshal(h.stdout.Bytes(), &got); err != nil {
		t.Fatalf("kp version -o json: %v\n%s", err, h.stdout.String())
	}
	want := statusapi.Build{Version: "v9.9.9-test", Commit: "abc123", BuildDate: "2026-11-20T10:00:00Z",
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if got != want {
		t.Errorf("kp version -o json = %+v, want %+v", got, want)
	}
	// kp proxy hands the same to the status API and kp_build_info.
	h = newHarness(t)
	if code := h.run("proxy", "--manifests", t.TempDir()); code != 0 {
		t.Fatalf("kp proxy: exit %d: %s", code, h.stderr.String())
	}
	if h.opts.Build != want {
		t.Errorf("kp proxy runs with build %+v, want %+v", h.opts.Build, want)
	}
	h = newHarness(t)
	if code := h.run("version", "-o", "yaml"); code == 0 || !strings.Contains(h.stderr.String(), `--output "yaml": want text or json`) {
		t.Errorf("kp version -o yaml: exit %d, stderr %q", code, h.stderr.String())
	}
}

func TestKpTopNameRunsTop(t *testing.T) {
	h := newHarness(t)
	// A flag only kp top has, with a value it refuses before it opens the
	// terminal.
	code := run(context.Background(), h.a, []string{"/usr/local/bin/kp-top", "--refresh", "1ms"})
	if code != exitUsage || !strings.Contains(h.stderr.String(), "--refresh 1ms: want at least 100ms") {
		t.Errorf("kp-top: exit %d, stderr %q", code, h.stderr.String())
	}
}

func TestKpTopWithoutATerminalSaysWhatToDo(t *testing.T) {
	h := newHarness(t)
	if code := h.run("top"); code != 1 || !strings.Contains(h.stderr.String(), "kp top needs a terminal: run it with 'kubectl exec -it'") {
		t.Errorf("exit %d, stderr %q", code, h.stderr.String())
	}
}

func TestKubeProxyNameRunsProxy(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	code := run(context.Background(), h.a, []string{"/usr/local/bin/kube-proxy", "--manifests", dir})
	if code != 0 || !h.ran || h.cfg.ManifestsDir != dir {
		t.Errorf("kube-proxy name: exit %d, ran %v, stderr %s", code, h.ran, h.stderr.String())
	}
}

func TestUnknownFlagPointsAtHelp(t *testing.T) {
	h := newHarness(t)
	code := h.run("proxy", "--no-such-flag")
	want := "kp: unknown flag: --no-such-flag (see 'kp proxy --help')\n"
	if code != exitUsage || h.stderr.String() != want {
		t.Errorf("exit %d, stderr %q, want %q", code, h.stderr.String(), want)
	}
}

func TestProxyStopsCleanlyOnSignal(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	h.runProxy = func(ctx context.Context) error {
		cancel() // as SIGTERM would
		<-ctx.Done()
		return ctx.Err()
	}
	if code := h.runCtx(ctx, "proxy", "--manifests", t.TempDir()); code != 0 {
		t.Errorf("exit %d after cancel, stderr:\n%s", code, h.stderr.String())
	}
}

func TestProxyReportsRunFailure(t *testing.T) {
	h := newHarness(t)
	h.runProxy = func(context.Context) error { return errors.New("healthz server: address already in use") }
	if code := h.run("proxy", "--manifests", t.TempDir()); code != 1 ||
		!strings.HasSuffix(h.stderr.String(), "kp: healthz server: address already in use\n") {
		t.Errorf("exit %d, stderr:\n%s", code, h.stderr.String())
	}
}

func TestFailingProbeOfAForcedModeStopsProxyWithClearError(t *testing.T) {
	h := newHarness(t)
	h.nft.probeErr = errors.New("nftables probe: the kernel refused kp's rule types")
	code := h.run("proxy", "--manifests", t.TempDir(), "--proxy-mode", "nftables")
	want := "kp: nftables mode cannot run on this node: nftables probe: the kernel refused kp's rule types\n"
	if code != 1 || !strings.HasSuffix(h.stderr.String(), want) || h.ran {
		t.Errorf("exit %d, ran %v, stderr:\n%s", code, h.ran, h.stderr.String())
	}
}

func TestAutoModeFallsBackToTheFirstModeWhoseProbePasses(t *testing.T) {
	for _, args := range [][]string{nil, {"--proxy-mode", "auto"}, {"--proxy-mode", ""}} {
		t.Run(fmt.Sprint(args), func(t *testing.T) {
			h := newHarness(t)
			ipt := &fakeBackend{mode: proxy.ModeIPTables}
			h.a.backends[proxy.ModeIPTables] = ipt.factory()
			h.nft.probeErr = errors.New("the kernel has no nf_tables")
			if code := h.run(append([]string{"proxy", "--manifests", t.TempDir()}, args...)...); code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
			}
			sw, ok := h.opts.Backend.(*migrate.Switcher)
			if !ok {
				t.Fatalf("kp proxy runs %T, not the Switcher", h.opts.Backend)
			}
			if b, _ := sw.Current(); h.cfg.Mode != proxy.ModeIPTables || b != ipt {
				t.Errorf("ran mode %s with backend %v, want iptables", h.cfg.Mode, h.opts.Backend)
			}
			// The iptables mode's own defaults, not nftables's.
			if h.cfg.NodePortPrimary {
				t.Error("iptables mode chosen by auto answers NodePorts only on primary IPs (nftables's default)")
			}
			c := h.opts.ModeChoice
			if c == nil || !c.Auto || len(c.Refused) != 1 || c.Refused[0].Mode != "nftables" ||
				!strings.Contains(c.Refused[0].Reason, "the kernel has no nf_tables") {
				t.Errorf("mode choice %+v, want auto with nftables refused for its reason", c)
			}
			for _, want := range []string{`"proxy mode refused" mode="nftables"`, "the kernel has no nf_tables", `"proxy mode chosen" mode="iptables"`} {
				if !strings.Contains(h.stderr.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, h.stderr.String())
				}
			}
		})
	}
}

func TestAutoModeWithNoWorkingModeNamesEveryReason(t *testing.T) {
	h := newHarness(t)
	h.nft.probeErr = errors.New("the kernel has no nf_tables")
	code := h.run("proxy", "--manifests", t.TempDir())
	out := h.stderr.String()
	for _, want := range []string{"kp: no proxy mode can run on this node", "nftables mode cannot run on this node: the kernel has no nf_tables",
		"iptables mode is not built into this kp", "userspace mode is not built into this kp"} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}
	if code != 1 || h.ran {
		t.Errorf("exit %d, ran %v", code, h.ran)
	}
}

func TestForcedModeIsReportedAsForced(t *testing.T) {
	h := newHarness(t)
	if code := h.run("proxy", "--manifests", t.TempDir(), "--proxy-mode", "nftables"); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
	}
	if c := h.opts.ModeChoice; c == nil || c.Auto || c.From != "--proxy-mode=nftables" {
		t.Errorf("mode choice %+v, want forced by --proxy-mode=nftables", c)
	}
}

func TestSourceSelection(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name      string
		args      []string
		env       map[string]string
		wantKube  []string // newKubeClient calls
		wantDir   bool
		wantError string
	}{
		{name: "manifests folder", args: []string{"--manifests", dir}, wantDir: true},
		{name: "manifests win over kubeconfig", args: []string{"--manifests", dir, "--kubeconfig", "/k"}, wantDir: true},
		{name: "kubeconfig", args: []string{"--kubeconfig", "/etc/kp/kubeconfig"}, wantKube: []string{"/etc/kp/kubeconfig|"}},
		{name: "master", args: []string{"--master", "https://10.0.0.1:6443"}, wantKube: []string{"|https://10.0.0.1:6443"}},
		{name: "in-cluster in a pod", env: map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
			wantKube: []string{"|"}},
		{name: "no source at all", wantError: "kp: no source of Services: pass --kubeconfig FILE or --master URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.env = tt.env
			code := h.run(append([]string{"proxy"}, tt.args...)...)
			if tt.wantError != "" {
				if code != 1 || !strings.Contains(h.stderr.String(), tt.wantError) || h.ran {
					t.Fatalf("exit %d, ran %v, stderr:\n%s", code, h.ran, h.stderr.String())
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
			}
			if strings.Join(h.kubeCalls, ",") != strings.Join(tt.wantKube, ",") {
				t.Errorf("kube clients built %q, want %q", h.kubeCalls, tt.wantKube)
			}
			if len(h.sources) != 1 {
				t.Fatalf("%d sources, want 1", len(h.sources))
			}
			_, isDir := h.sources[0].(*source.DirSource)
			if isDir != tt.wantDir {
				t.Errorf("source %T, want folder source %v", h.sources[0], tt.wantDir)
			}
		})
	}
}

func TestCleanup(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"kp cleanup", []string{"cleanup"}},
		{"kube-proxy's --cleanup", []string{"proxy", "--cleanup"}},
		{"--cleanup with a mode kp has not built still cleans", []string{"proxy", "--cleanup", "--proxy-mode", "ipvs"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			if code := h.run(tt.args...); code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
			}
			if h.nft.cleanups != 1 || h.ran {
				t.Errorf("nft cleanups %d (want 1), proxy ran %v", h.nft.cleanups, h.ran)
			}
		})
	}
}

func TestCleanupFailureExits1(t *testing.T) {
	h := newHarness(t)
	h.nft.cleanupErr = errors.New("netlink: operation not permitted")
	code := h.run("cleanup")
	want := "kp: cleanup nftables mode: netlink: operation not permitted\n"
	if code != 1 || !strings.HasSuffix(h.stderr.String(), want) {
		t.Errorf("exit %d, stderr:\n%s", code, h.stderr.String())
	}
}

func TestNFTablesModeCleansConntrackAfterSyncs(t *testing.T) {
	h := newHarness(t)
	if code := h.run("proxy", "--manifests", t.TempDir()); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr.String())
	}
	var cleaner *conntrack.Cleaner
	for _, o := range h.opts.Observers {
		if c, ok := o.(*conntrack.Cleaner); ok {
			cleaner = c
		}
	}
	if cleaner == nil {
		t.Fatalf("no conntrack cleaner among the sync observers: %#v", h.opts.Observers)
	}
	if len(h.opts.Collectors) == 0 {
		t.Error("the cleaner's metrics are not registered")
	}
}

func TestIPTablesModeIsBuiltAndCleansConntrack(t *testing.T) {
	a := newApp(io.Discard, io.Discard)
	if _, ok := a.backends[proxy.ModeIPTables]; !ok {
		t.Fatal("no iptables backend registered")
	}
	a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := proxy.Config{Mode: proxy.ModeIPTables}
	if opts := a.runOptions(cfg, nil, nil); len(opts.Observers) == 0 {
		t.Error("iptables mode runs without the stale conntrack cleaner")
	}
}

// fakeProcSys is a /proc/sys with the conntrack sysctls at a Debian
// kernel's defaults, and a /sys/module for the hash size under module/.
func fakeProcSys(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"net/netfilter/nf_conntrack_max":                     "262144",
		"net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "60",
		"net/netfilter/nf_conntrack_tcp_be_liberal":          "0",
		"net/netfilter/nf_conntrack_udp_timeout":             "30",
		"net/netfilter/nf_conntrack_udp_timeout_stream":      "120",
		"net/netfilter/nf_conntrack_acct":                    "0",
		"net/netfilter/nf_conntrack_timestamp":               "0",
		"module/nf_conntrack/parameters/hashsize":            "65536",
	}
	for name, v := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
