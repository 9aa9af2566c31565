package main

import (
	"context"
	"log/slog"
	"reflect"
	"testing"

	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/proxy"
)

// recordingFactory builds fake backends of one mode and keeps the Config
// of each built to run that mode (cleanups build every mode with the
// running mode's Config).
type recordingFactory struct {
	mode  proxy.Mode
	built []proxy.Config
}

func (f *recordingFactory) factory() backendFactory {
	return func(cfg proxy.Config, _ *slog.Logger) (proxy.Backend, error) {
		if cfg.Mode == f.mode {
			f.built = append(f.built, cfg)
		}
		return &fakeBackend{mode: f.mode, cfg: cfg}, nil
	}
}

// A backend a switch programs is built from the Config a kp started in its
// mode, with the same flags, is built from: one constructor path. (kp
// started in nftables mode, NodePorts on primary IPs by default, once
// switched to userspace answered NodePorts only on the Node's IPs, and on
// none when the Node had none.)
func TestSwitchBuildsTheBackendAKpStartedInItsModeBuilds(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name     string
		args     []string
		from, to proxy.Mode
	}{
		{"nftables to userspace", []string{"--cluster-cidr", "10.244.0.0/16"}, proxy.ModeNFTables, proxy.ModeUserspace},
		{"nftables to iptables", nil, proxy.ModeNFTables, proxy.ModeIPTables},
		{"iptables to nftables", []string{"--iptables-masquerade-bit", "9"}, proxy.ModeIPTables, proxy.ModeNFTables},
		{"userspace to nftables, NodePort CIDRs", []string{"--nodeport-addresses", "10.0.0.0/8"}, proxy.ModeUserspace, proxy.ModeNFTables},
	} {
		t.Run(c.name, func(t *testing.T) {
			configOf := func(mode proxy.Mode, switchTo proxy.Mode) proxy.Config {
				h := newHarness(t)
				fs := map[proxy.Mode]*recordingFactory{}
				for _, m := range []proxy.Mode{proxy.ModeNFTables, proxy.ModeIPTables, proxy.ModeUserspace} {
					fs[m] = &recordingFactory{mode: m}
					h.a.backends[m] = fs[m].factory()
				}
				args := append([]string{"proxy", "--manifests", dir, "--proxy-mode", string(mode)}, c.args...)
				if code := h.run(args...); code != 0 {
					t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
				}
				if switchTo == "" {
					return fs[mode].built[0]
				}
				sw := h.opts.Backend.(*migrate.Switcher)
				ctx := context.Background()
				st := &proxy.State{Node: proxy.Node{Name: "node-a.example"}}
				if err := sw.Sync(ctx, st); err != nil {
					t.Fatal(err)
				}
				if _, err := sw.Request(proxy.Target{Mode: switchTo}, "test"); err != nil {
					t.Fatal(err)
				}
				if err := sw.Sync(ctx, st); err != nil {
					t.Fatal(err)
				}
				if len(fs[switchTo].built) != 1 {
					t.Fatalf("the switch built %d %s backends, want 1", len(fs[switchTo].built), switchTo)
				}
				return fs[switchTo].built[0]
			}
			switched, started := configOf(c.from, c.to), configOf(c.to, "")
			if !reflect.DeepEqual(switched, started) {
				t.Errorf("%s built by a switch from %s:\n%+v\nstarted in %s:\n%+v", c.to, c.from, switched, c.to, started)
			}
		})
	}
}
