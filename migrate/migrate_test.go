package migrate

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

func readFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func parse(t *testing.T, text string) map[iptables.Table]*iptables.Dump {
	t.Helper()
	d, err := iptables.ParseSave([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestPlanRemovesKubeProxysChainsAndJumpsButNotWhatOthersUse(t *testing.T) {
	nat := planTable(parse(t, readFixture(t, "kube-proxy-iptables-nat.rules"))[iptables.TableNAT])
	if want := []string{"KUBE-MARK-MASQ"}; !slices.Equal(nat.kept, want) {
		t.Errorf("nat kept %v, want %v (the CNI's chain jumps into it)", nat.kept, want)
	}
	for _, c := range []string{"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY",
		"KUBE-SVC-TCOU7JCQXEZGVUNU", "KUBE-SEP-ZP3FB6NMPNCO4VBJ", "KUBE-EXT-TCOU7JCQXEZGVUNU"} {
		if !slices.Contains(nat.chains, c) {
			t.Errorf("nat plan does not remove %s: %v", c, nat.chains)
		}
	}
	if slices.Contains(nat.chains, "CNI-MASQ") || len(nat.jumps) != 3 {
		t.Errorf("nat plan: chains %v, jumps %v; want kube-proxy's 3 jumps from built-in chains", nat.chains, nat.jumps)
	}

	filter := planTable(parse(t, readFixture(t, "kube-proxy-iptables-filter.rules"))[iptables.TableFilter])
	for _, c := range []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "OPERATOR"} {
		if slices.Contains(filter.chains, c) {
			t.Errorf("filter plan removes %s, which is not kube-proxy's", c)
		}
	}
	if len(filter.kept) != 0 || len(filter.jumps) != 9 || len(filter.chains) != 6 {
		t.Errorf("filter plan: %d jumps, chains %v, kept %v; want 9 jumps, 6 chains", len(filter.jumps), filter.chains, filter.kept)
	}
}

func TestNothingOfKubeProxysIsAnEmptyPlan(t *testing.T) {
	d := parse(t, readFixture(t, "after-filter.rules"))[iptables.TableFilter]
	if p := planTable(d); !p.empty() || len(p.kept) != 0 {
		t.Errorf("plan for a table without kube-proxy: %+v", p)
	}
}

// The kernel test loads kube-proxy-shaped rules next to kubelet's, a
// CNI's and an operator's into each iptables flavor of a throwaway
// namespace, removes kube-proxy's, and compares with the same flavor's
// save of the foreign rules alone.
func TestKernelRemovesKubeProxysIPTablesRulesOnly(t *testing.T) {
	netns.Require(t, "iptables-nft-restore", "iptables-legacy-restore", "iptables-nft-save", "iptables-legacy-save")
	for _, fl := range []iptables.Flavor{iptables.FlavorNFT, iptables.FlavorLegacy} {
		t.Run(string(fl), func(t *testing.T) {
			ctx := context.Background()
			r := iptables.NewRunner(fl, proxy.IPv4)
			save := func(ns string) string {
				var out []byte
				if err := netns.InNamespace(ns, func() (err error) { out, err = iptables.SaveAll(ctx, fl, proxy.IPv4); return err }); err != nil {
					t.Fatal(err)
				}
				return normalise(string(out))
			}
			load := func(ns string, files ...string) {
				for _, f := range files {
					if err := netns.InNamespace(ns, func() error { return r.Restore(ctx, []byte(readFixture(t, f))) }); err != nil {
						t.Fatalf("load %s: %v", f, err)
					}
				}
			}
			want := netns.NewNamespace(t, "mgw")
			load(want, "after-nat.rules", "after-filter.rules")
			ns := netns.NewNamespace(t, "mgr")
			load(ns, "kube-proxy-iptables-nat.rules", "kube-proxy-iptables-filter.rules")

			var found []IPTablesFound
			if err := netns.InNamespace(ns, func() (err error) { found, err = KubeProxyIPTables(ctx, true); return err }); err != nil {
				t.Fatal(err)
			}
			if got := save(ns); got != save(want) {
				t.Errorf("after removal:\n%s\nwant:\n%s", got, save(want))
			}
			i := slices.IndexFunc(found, func(f IPTablesFound) bool { return f.Flavor == fl && f.Family == proxy.IPv4 })
			if i < 0 || found[i].Chains != 14 || found[i].Jumps != 12 || !slices.Equal(found[i].Kept, []string{"KUBE-MARK-MASQ"}) {
				t.Errorf("found %v", found)
			}
			// Again: nothing left to do.
			if err := netns.InNamespace(ns, func() (err error) { found, err = KubeProxyIPTables(ctx, true); return err }); err != nil {
				t.Fatal(err)
			}
			if i := slices.IndexFunc(found, func(f IPTablesFound) bool { return f.Flavor == fl && f.Family == proxy.IPv4 }); found[i].Chains+found[i].Jumps != 0 {
				t.Errorf("second run found %v", found[i])
			}
		})
	}
}

func TestKernelRemovesKubeProxysNFTablesTablesOnly(t *testing.T) {
	netns.Require(t, "nft")
	ns := netns.NewNamespace(t, "mgn")
	script := `table ip kube-proxy {
	chain services {
		ip daddr 10.96.0.10 tcp dport 53 accept
	}
}
table ip6 kube-proxy {
	chain services {
	}
}
table inet kube-proxy {
	chain mine {
	}
}
table ip foreign {
	chain c {
	}
}
`
	nft := func(args ...string) string {
		out, err := netns.Exec(ns, append([]string{"nft"}, args...)...)
		if err != nil {
			t.Fatalf("nft %v: %v\n%s", args, err, out)
		}
		return out
	}
	path := t.TempDir() + "/rules.nft"
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	nft("-f", path)
	var found []NFTablesFound
	if err := netns.InNamespace(ns, func() (err error) { found, err = KubeProxyNFTables(true); return err }); err != nil {
		t.Fatal(err)
	}
	if len(found) != 2 || found[0].Chains != 1 {
		t.Errorf("found %v, want ip and ip6 kube-proxy", found)
	}
	got := nft("list", "tables")
	for _, want := range []string{"table inet kube-proxy", "table ip foreign"} {
		if !strings.Contains(got, want) {
			t.Errorf("removal took %q too:\n%s", want, got)
		}
	}
	if strings.Contains(got, "table ip kube-proxy") || strings.Contains(got, "table ip6 kube-proxy") {
		t.Errorf("kube-proxy's tables are left:\n%s", got)
	}
}

func TestTakeOverRunsOnceAfterTheFirstSyncAndSparesTheRunningMode(t *testing.T) {
	var calls []string
	to := &TakeOver{Mode: proxy.ModeNFTables, Log: slog.New(slog.DiscardHandler),
		Others: map[proxy.Mode]func(context.Context, bool) (int, error){
			proxy.ModeNFTables: func(context.Context, bool) (int, error) { calls = append(calls, "nftables"); return 0, nil },
			proxy.ModeIPTables: func(context.Context, bool) (int, error) {
				calls = append(calls, "iptables")
				return 0, errors.New("boom")
			},
		},
		kubeProxyIPTables: func(_ context.Context, remove bool) ([]IPTablesFound, error) {
			calls = append(calls, "kube-proxy iptables")
			return nil, nil
		},
		kubeProxyIPVS: func(context.Context, Removal, []NodePort) (IPVSFound, error) {
			calls = append(calls, "kube-proxy ipvs")
			return IPVSFound{}, nil
		},
		kubeProxyNFTables: func(remove bool) ([]NFTablesFound, error) {
			calls = append(calls, "kube-proxy nftables")
			return nil, nil
		},
	}
	to.Synced(context.Background(), nil, &proxy.State{})
	to.Synced(context.Background(), nil, &proxy.State{})
	if want := []string{"kube-proxy iptables", "kube-proxy ipvs", "kube-proxy nftables", "iptables"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
}

var counters = regexp.MustCompile(`(?m)^#.*$|\[\d+:\d+\]`)

// normalise drops iptables-save's comments (dates) and counters.
func normalise(s string) string { return strings.TrimSpace(counters.ReplaceAllString(s, "")) }

func TestTakeOverInIPVSModeKeepsTheNodePortVirtualServersKpServesToo(t *testing.T) {
	for _, tc := range []struct {
		mode proxy.Mode
		want int
	}{{proxy.ModeNFTables, 1}, {proxy.ModeIPVS, 0}} {
		var got []NodePort
		to := &TakeOver{Mode: tc.mode, Log: slog.New(slog.DiscardHandler), NodePorts: []NodePort{{Protocol: 6, Port: 30080}},
			kubeProxyIPTables: func(context.Context, bool) ([]IPTablesFound, error) { return nil, nil },
			kubeProxyNFTables: func(bool) ([]NFTablesFound, error) { return nil, nil },
			kubeProxyIPVS: func(_ context.Context, _ Removal, ps []NodePort) (IPVSFound, error) {
				got = ps
				return IPVSFound{}, nil
			}}
		if _, err := to.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(got) != tc.want {
			t.Errorf("running %s: kube-proxy's NodePort virtual servers to remove %v, want %d", tc.mode, got, tc.want)
		}
	}
}

// With KeepActive, kube-proxy's ipvs leftovers and kp's ipvs mode keep what
// carries established connections, and Run sums what they kept; without it
// everything goes.
func TestTakeOverKeepsIPVSStateWithConnectionsOnlyWhenAsked(t *testing.T) {
	for _, keep := range []bool{false, true} {
		var how Removal
		var othersKeep bool
		to := &TakeOver{Mode: proxy.ModeNFTables, Log: slog.New(slog.DiscardHandler), KeepActive: keep,
			Others: map[proxy.Mode]func(context.Context, bool) (int, error){
				proxy.ModeIPVS: func(_ context.Context, k bool) (int, error) {
					othersKeep = k
					if k {
						return 2, nil
					}
					return 0, nil
				},
			},
			kubeProxyIPTables: func(context.Context, bool) ([]IPTablesFound, error) { return nil, nil },
			kubeProxyNFTables: func(bool) ([]NFTablesFound, error) { return nil, nil },
			kubeProxyIPVS: func(_ context.Context, h Removal, _ []NodePort) (IPVSFound, error) {
				how = h
				if h == RemoveIdle {
					return IPVSFound{VirtualServers: 3, Kept: 1}, nil
				}
				return IPVSFound{VirtualServers: 3}, nil
			}}
		kept, err := to.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		wantHow, wantKept := RemoveAll, 0
		if keep {
			wantHow, wantKept = RemoveIdle, 3
		}
		if how != wantHow || othersKeep != keep || kept != wantKept {
			t.Errorf("KeepActive %v: kube-proxy's removal %v, kp's ipvs mode keeping %v, kept %d; want %v, %v, %d",
				keep, how, othersKeep, kept, wantHow, keep, wantKept)
		}
	}
}

func TestKubeProxyIPSetsAreKnownByTheirIPv6NamesCutTo31Characters(t *testing.T) {
	for name, want := range map[string]bool{
		"KUBE-CLUSTER-IP":                  true,
		"KUBE-6-CLUSTER-IP":                true,
		"KUBE-6-NODE-PORT-LOCAL-SCTP-HAS":  true, // KUBE-6-NODE-PORT-LOCAL-SCTP-HASH, cut
		"KUBE-6-LOAD-BALANCER-SOURCE-CID":  true,
		"KUBE-6-NODE-PORT-LOCAL-SCTP-HASH": false, // ipset has no such name
		"KUBE-6-MINE":                      false,
		"KP-CLUSTER-IP":                    false,
	} {
		if got := isKubeProxyIPSet(name); got != want {
			t.Errorf("isKubeProxyIPSet(%q) = %v, want %v", name, got, want)
		}
	}
}
