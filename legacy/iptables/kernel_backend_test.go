package iptables

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// kernelBackend is a Backend of flavor fl (IPv4 and IPv6) for namespace
// ns: every call must run inside it (inNS).
func kernelBackend(t testing.TB, fl Flavor, c *clock, opts ...Option) *Backend {
	t.Helper()
	cfg := testConfig()
	cfg.IPTablesBackend = string(fl)
	opts = append([]Option{WithClock(c.now), WithRouteLocalnet(func() error { return nil }),
		WithLocalAddrs(func() ([]netip.Addr, error) { return nil, nil })}, opts...)
	b, err := New(cfg, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// recorder is a Runner that keeps every input it restores.
type recorder struct {
	Runner
	inputs []string
}

func (r *recorder) Restore(ctx context.Context, data []byte) error {
	r.inputs = append(r.inputs, string(data))
	return r.Runner.Restore(ctx, data)
}

// kernelWorld: a ClusterIP + NodePort + LoadBalancer service with source
// ranges, dual-stack, and a second plain ClusterIP service.
func kernelWorld() *statetest.World {
	w := newWorld()
	web := w.AddService(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.96.0.10", 80, 30080, "10.244.1.1:8080", "10.244.2.3:8080")
	web.Type = v1.ServiceTypeLoadBalancer
	web.ClusterIPs = append(web.ClusterIPs, netip.MustParseAddr("fd00:96::10"))
	web.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::7")}
	web.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48")}
	web.AffinityTimeout = time.Hour
	w.Endpoints[web.Name] = append(w.Endpoints[web.Name],
		proxy.Endpoint{IP: netip.MustParseAddr("fd00:10:244::1"), Port: 8080, Ready: true}.At("node-1", ""))
	w.AddService(statetest.PortName("demo", "db", "", v1.ProtocolTCP), "10.96.0.11", 5432, 0, "10.244.2.4:5432")
	udp := statetest.PortName("demo", "dns", "", v1.ProtocolUDP)
	w.AddService(udp, "10.96.0.12", 53, 0)
	w.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	return w
}

// syncIn syncs st with b in namespace ns, failing the test on error.
func syncIn(t *testing.T, ns string, b *Backend, st *proxy.State) {
	t.Helper()
	inNS(t, ns, func() error { return b.Sync(context.Background(), st) })
}

func TestKernelSyncLoadsThenSendsOnlyTheChange(t *testing.T) {
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		t.Run(string(fl), func(t *testing.T) {
			ns := testNamespace(t)
			c := newClock()
			v4 := &recorder{Runner: NewRunner(fl, proxy.IPv4)}
			b := kernelBackend(t, fl, c, WithRunners(v4, NewRunner(fl, proxy.IPv6)))
			w := kernelWorld()
			syncIn(t, ns, b, w.Next())
			web := w.Services[statetest.PortName("demo", "web", "http", v1.ProtocolTCP)]
			for _, ff := range []flavorFamily{{fl, proxy.IPv4}, {fl, proxy.IPv6}} {
				nat := saveIn(t, ns, ff, TableNAT)
				for _, want := range []string{":KP-SERVICES", svcChainName(web), fwChainName(web), "--to-destination", "-j KP-SERVICES"} {
					if !strings.Contains(nat, want) {
						t.Errorf("%s nat lacks %q:\n%s", ff, want, nat)
					}
				}
				if filter := saveIn(t, ns, ff, TableFilter); !strings.Contains(filter, "KP-PROXY-FIREWALL") ||
					ff.Family == proxy.IPv4 && !strings.Contains(filter, "has no endpoints") {
					t.Errorf("%s filter:\n%s", ff, filter)
				}
			}

			var counters map[proxy.EndpointRef]proxy.EndpointCounter
			inNS(t, ns, func() error {
				var err error
				counters, err = b.EndpointCounters(&w.State)
				return err
			})
			if _, ok := counters[proxy.EndpointRef{ServicePort: web.Name, Endpoint: netip.MustParseAddrPort("[fd00:10:244::1]:8080")}]; !ok || len(counters) != 4 {
				t.Errorf("counters of every endpoint, both families: %v", counters)
			}

			w.SetEndpoints(web.Name, "10.244.1.1:8080", "10.244.2.9:8080")
			syncIn(t, ns, b, w.Next())
			if b.LastSyncFull() {
				t.Error("the second sync was full")
			}
			in := v4.inputs[len(v4.inputs)-1]
			if !strings.Contains(in, "10.244.2.9:8080") || strings.Contains(in, "demo/db") || strings.Contains(in, "*filter") {
				t.Errorf("the partial input is not web's chains alone:\n%s", in)
			}
			if nat := saveIn(t, ns, flavorFamily{fl, proxy.IPv4}, TableNAT); !strings.Contains(nat, "10.244.2.9:8080") || strings.Contains(nat, "10.244.2.3:8080") {
				t.Errorf("the kernel does not have the change:\n%s", nat)
			}
		})
	}
}

func TestKernelFullSyncRepairsHandEditsWithoutDuplicates(t *testing.T) {
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		t.Run(string(fl), func(t *testing.T) {
			ns := testNamespace(t)
			c := newClock()
			b := kernelBackend(t, fl, c)
			w := kernelWorld()
			syncIn(t, ns, b, w.Next())
			ff := flavorFamily{fl, proxy.IPv4}
			good := saveIn(t, ns, ff, TableNAT)
			web := w.Services[statetest.PortName("demo", "web", "http", v1.ProtocolTCP)]
			// An operator flushes web's chain, deletes the jump from
			// PREROUTING, adds a chain of kp's that it never wrote and
			// duplicates the jump from OUTPUT twice.
			restoreIn(t, ns, ff, "*nat\n:"+svcChainName(web)+" - [0:0]\n:KP-SEP-STALESTALESTALE - [0:0]\n"+
				"-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KP-SERVICES\n"+
				"-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KP-SERVICES\n"+
				"-I OUTPUT 1 -m comment --comment \"kubernetes service portals\" -j KP-SERVICES\nCOMMIT\n")
			c.t = c.t.Add(2 * time.Hour)
			syncIn(t, ns, b, w.Next())
			if !b.LastSyncFull() {
				t.Fatal("no full sync after the hour")
			}
			if got := saveIn(t, ns, ff, TableNAT); normalise(got) != normalise(good) {
				t.Errorf("not repaired:\n%s\nwant:\n%s", got, good)
			}
			// kp restarting on the node: a new backend's first sync
			// leaves the same tables, jumps not duplicated.
			b2 := kernelBackend(t, fl, c)
			syncIn(t, ns, b2, w.Next())
			if got := saveIn(t, ns, ff, TableNAT); normalise(got) != normalise(good) {
				t.Errorf("a restart changed the table:\n%s\nwant:\n%s", got, good)
			}
		})
	}
}

// A node upgraded from a kp that jumped from filter INPUT to KP-SERVICES
// (retiredJumps) loses that jump at the new kp's first sync, and keeps
// every other jump.
func TestKernelFirstSyncDeletesTheRetiredInputJump(t *testing.T) {
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		t.Run(string(fl), func(t *testing.T) {
			ns := testNamespace(t)
			c := newClock()
			w := kernelWorld()
			syncIn(t, ns, kernelBackend(t, fl, c), w.Next())
			ff := flavorFamily{fl, proxy.IPv4}
			good := saveIn(t, ns, ff, TableFilter)
			if strings.Contains(good, "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KP-SERVICES") {
				t.Fatalf("kp jumps from INPUT to KP-SERVICES:\n%s", good)
			}
			restoreIn(t, ns, ff, "*filter\n-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KP-SERVICES\nCOMMIT\n")
			syncIn(t, ns, kernelBackend(t, fl, c), w.Next())
			if got := saveIn(t, ns, ff, TableFilter); normalise(got) != normalise(good) {
				t.Errorf("the retired jump stays:\n%s\nwant:\n%s", got, good)
			}
		})
	}
}

func TestKernelRefusedBatchChangesNothingAndNamesTheService(t *testing.T) {
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		t.Run(string(fl), func(t *testing.T) {
			ns := testNamespace(t)
			c := newClock()
			db := statetest.PortName("demo", "db", "", v1.ProtocolTCP)
			b := kernelBackend(t, fl, c, WithInjectedRule(db, "-m statistic --mode random --probability 7 -j RETURN"))
			w := kernelWorld()
			delete(w.Services, db)
			delete(w.Endpoints, db)
			syncIn(t, ns, b, w.Next())
			ff := flavorFamily{fl, proxy.IPv4}
			before := saveIn(t, ns, ff, TableNAT) + saveIn(t, ns, ff, TableFilter)
			w.AddService(db, "10.96.0.11", 5432, 0, "10.244.2.4:5432")
			var err error
			inNS(t, ns, func() error { err = b.Sync(context.Background(), w.Next()); return nil })
			if err == nil || !strings.Contains(err.Error(), "demo/db") {
				t.Fatalf("error %v does not name demo/db", err)
			}
			t.Logf("error: %v", err)
			if after := saveIn(t, ns, ff, TableNAT) + saveIn(t, ns, ff, TableFilter); normalise(after) != normalise(before) {
				t.Errorf("the refused batch changed the kernel:\n%s\nbefore:\n%s", after, before)
			}
		})
	}
}

// normalise drops iptables-save's comment lines and counters.
func normalise(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, ":") {
			if i := strings.LastIndex(l, " ["); i > 0 {
				l = l[:i]
			}
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

func TestKernelLoadsTheDispatchTriesInBothFamilies(t *testing.T) {
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		t.Run(string(fl), func(t *testing.T) {
			ns := testNamespace(t)
			c := newClock()
			b := kernelBackend(t, fl, c)
			w := newWorld()
			for i := 0; i < 300; i++ {
				name := statetest.PortName("ns", "svc-"+strconv.Itoa(i), "", v1.ProtocolTCP)
				sp := w.AddService(name, netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String(), 80, int32(30000+i))
				sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr("fd00:96::"+strconv.FormatInt(int64(i), 16)))
				if i%3 > 0 {
					w.SetEndpoints(name, "10.244.1.1:80")
					w.Endpoints[name] = append(w.Endpoints[name], proxy.Endpoint{IP: netip.MustParseAddr("fd00:10:244::1"), Port: 80, Ready: true})
				}
			}
			syncIn(t, ns, b, w.Next())
			for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
				ff := flavorFamily{fl, f}
				nat, filter := saveIn(t, ns, ff, TableNAT), saveIn(t, ns, ff, TableFilter)
				for _, want := range []string{"-j KP-SVCS-2-1", "-g KP-NPS-tcp-", "KP-FSVCS-"} {
					if !strings.Contains(nat+filter, want) {
						t.Errorf("%s: no %q in:\n%s", ff, want, nat)
					}
				}
				// The non-CIDR masks load as written.
				mask := "-d 0.0.0.1/0.0.0.3 "
				if f == proxy.IPv6 {
					mask = "-d ::1/::3 "
				}
				if !strings.Contains(nat, mask) {
					t.Errorf("%s: no %q in:\n%s", ff, mask, nat)
				}
			}
		})
	}
}

func TestKernelStagedColdStartLoadsWhatOneRestoreLoads(t *testing.T) {
	staged, whole := testNamespace(t), testNamespace(t)
	c := newClock()
	v4 := &recorder{Runner: NewRunner(FlavorNFT, proxy.IPv4)}
	b := kernelBackend(t, FlavorNFT, c, WithRunners(v4, NewRunner(FlavorNFT, proxy.IPv6)), WithStaging(2))
	ref := kernelBackend(t, FlavorNFT, c, WithStaging(0))
	w := kernelWorld()
	syncIn(t, staged, b, w.Next())
	syncIn(t, whole, ref, w.Next())
	if len(v4.inputs) < 3 {
		t.Errorf("IPv4 cold start in %d restores; want staging restores of 2 chains, then the sync's own", len(v4.inputs))
	}
	for _, ff := range []flavorFamily{{FlavorNFT, proxy.IPv4}, {FlavorNFT, proxy.IPv6}} {
		for _, tb := range []Table{TableNAT, TableFilter} {
			got, want := normalise(saveIn(t, staged, ff, tb)), normalise(saveIn(t, whole, ff, tb))
			if sortLines(got) != sortLines(want) {
				t.Errorf("%s %s after a staged cold start:\n%s\nafter one restore:\n%s", ff, tb, got, want)
			}
		}
	}
}

// sortLines orders s's lines by chain, each chain's rules kept in their
// order: iptables-save lists chains in the order the kernel created them,
// which staging changes.
func sortLines(s string) string {
	lines := strings.Split(s, "\n")
	key := func(l string) string {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "-A" {
			return "-A " + f[1]
		}
		return l
	}
	slices.SortStableFunc(lines, func(a, b string) int { return strings.Compare(key(a), key(b)) })
	return strings.Join(lines, "\n")
}
