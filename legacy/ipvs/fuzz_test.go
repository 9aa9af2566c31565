package ipvs

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/ipvs"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/fuzzsync"
)

// FuzzManifestToIPVS follows arbitrary manifest bytes through the folder
// source's decoder and the change tracker (fuzzsync.Check) into the ipvs
// backend on an in-memory kernel (fakeKernel: the IPVS table, kp-ipvs0's
// addresses, the ipsets and the iptables restores), which refuses what the
// kernel refuses: a virtual or real server added twice, one updated or
// deleted that is not there. After every change (objects removed, put
// back, one Service deleted and re-added) what partial syncs left must
// equal what a fresh backend leaves after one full sync of the same State.
// Seeds: the demo's manifests, nft's testdata/manifests and the committed
// corpus (testdata/fuzz/FuzzManifestToIPVS).
func FuzzManifestToIPVS(f *testing.F) {
	fuzzsync.AddSeeds(f, "../../manifests/demo/*.yaml", "../../nft/testdata/manifests/*.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzsync.Check(t, data, newIPVSRenderer)
	})
}

type ipvsRenderer struct {
	b *Backend
	k *fakeKernel
}

func newIPVSRenderer(t *testing.T) fuzzsync.Renderer {
	k := newFakeKernel()
	cfg := proxy.Config{Mode: proxy.ModeIPVS, MasqueradeBit: 14, IPVS: proxy.IPVSConfig{Scheduler: "rr"},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	b, err := New(cfg, nil, WithKernel(k, k, k, &fakeRunner{k: k, fam: proxy.IPv4}, &fakeRunner{k: k, fam: proxy.IPv6}),
		WithLocalAddrs(func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("fd00::10")}, nil
		}),
		WithDrain(DefaultDrainBound, 0))
	if err != nil {
		t.Fatal(err)
	}
	return ipvsRenderer{b: b, k: k}
}

func (r ipvsRenderer) Sync(st *proxy.State) error { return r.b.Sync(context.Background(), st) }
func (r ipvsRenderer) Dump() string               { return r.k.dump() }

// fakeKernel is the ipvs mode's kernel in memory: Handle, Links, IPSet,
// and (through fakeRunner) the last iptables-restore input per family.
// Real servers report no connections, so a drained one is deleted at once.
type fakeKernel struct {
	services map[vsKey]*ipvs.Service
	dests    map[vsKey]map[netip.AddrPort]int // weight
	addrs    map[netip.Addr]bool
	sets     map[string]map[string]bool
	rules    map[proxy.Family]string
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{services: map[vsKey]*ipvs.Service{}, dests: map[vsKey]map[netip.AddrPort]int{},
		addrs: map[netip.Addr]bool{}, sets: map[string]map[string]bool{}, rules: map[proxy.Family]string{}}
}

// dump lists virtual servers with their real servers and weights, the
// dummy's addresses, kp's sets and the iptables input, each sorted.
func (k *fakeKernel) dump() string {
	var lines []string
	for key, s := range k.services {
		var ds []string
		for d, w := range k.dests[key] {
			ds = append(ds, fmt.Sprintf("%s w=%d", d, w))
		}
		slices.Sort(ds)
		lines = append(lines, fmt.Sprintf("server %s %s flags=%d t=%d [%s]", key, s.SchedName, s.Flags, s.Timeout, strings.Join(ds, ", ")))
	}
	for a := range k.addrs {
		lines = append(lines, "addr "+a.String())
	}
	for name, es := range k.sets {
		lines = append(lines, fmt.Sprintf("set %s %v", name, slices.Sorted(maps.Keys(es))))
	}
	slices.Sort(lines)
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		lines = append(lines, f.String()+" iptables-restore:\n"+k.rules[f])
	}
	return strings.Join(lines, "\n")
}

func keyOf(s *ipvs.Service) vsKey {
	k, ok := kernelKey(s)
	if !ok {
		panic(fmt.Sprintf("kp sent a virtual server it cannot name: %+v", s))
	}
	return k
}

func (k *fakeKernel) GetServices() ([]*ipvs.Service, error) {
	var out []*ipvs.Service
	for _, key := range sortedKeys(k.services) {
		c := *k.services[key]
		out = append(out, &c)
	}
	return out, nil
}

func (k *fakeKernel) GetService(s *ipvs.Service) (*ipvs.Service, error) {
	have, ok := k.services[keyOf(s)]
	if !ok {
		return nil, syscall.ENOENT
	}
	c := *have
	return &c, nil
}

func (k *fakeKernel) IsServicePresent(s *ipvs.Service) bool { return k.services[keyOf(s)] != nil }

func (k *fakeKernel) NewService(s *ipvs.Service) error {
	key := keyOf(s)
	if k.services[key] != nil {
		return fmt.Errorf("new virtual server %s: %w", key, syscall.EEXIST)
	}
	c := *s
	k.services[key], k.dests[key] = &c, map[netip.AddrPort]int{}
	return nil
}

func (k *fakeKernel) UpdateService(s *ipvs.Service) error {
	key := keyOf(s)
	if k.services[key] == nil {
		return fmt.Errorf("update virtual server %s: %w", key, syscall.ENOENT)
	}
	c := *s
	k.services[key] = &c
	return nil
}

func (k *fakeKernel) DelService(s *ipvs.Service) error {
	key := keyOf(s)
	if k.services[key] == nil {
		return fmt.Errorf("delete virtual server %s: %w", key, syscall.ENOENT)
	}
	delete(k.services, key)
	delete(k.dests, key)
	return nil
}

func (k *fakeKernel) GetDestinations(s *ipvs.Service) ([]*ipvs.Destination, error) {
	key := keyOf(s)
	if k.services[key] == nil {
		return nil, syscall.ENOENT
	}
	var out []*ipvs.Destination
	for _, d := range slices.SortedFunc(maps.Keys(k.dests[key]), netip.AddrPort.Compare) {
		out = append(out, destination(d, k.dests[key][d]))
	}
	return out, nil
}

func (k *fakeKernel) setDest(s *ipvs.Service, d *ipvs.Destination, exists bool) error {
	key, ap := keyOf(s), destAddrPort(d)
	ds := k.dests[key]
	if ds == nil {
		return fmt.Errorf("real server %s of %s: no such virtual server: %w", ap, key, syscall.ENOENT)
	}
	if _, ok := ds[ap]; ok != exists {
		return fmt.Errorf("real server %s of %s: exists=%v: %w", ap, key, ok, syscall.EINVAL)
	}
	ds[ap] = d.Weight
	return nil
}

func (k *fakeKernel) NewDestination(s *ipvs.Service, d *ipvs.Destination) error {
	return k.setDest(s, d, false)
}

func (k *fakeKernel) UpdateDestination(s *ipvs.Service, d *ipvs.Destination) error {
	return k.setDest(s, d, true)
}

func (k *fakeKernel) DelDestination(s *ipvs.Service, d *ipvs.Destination) error {
	if err := k.setDest(s, d, true); err != nil {
		return err
	}
	delete(k.dests[keyOf(s)], destAddrPort(d))
	return nil
}

func (k *fakeKernel) SetConfig(*ipvs.Config) error { return nil }
func (k *fakeKernel) Close()                       {}

// Links: kp-ipvs0, always there.
func (k *fakeKernel) Ensure() error { return nil }
func (k *fakeKernel) Addrs() ([]netip.Addr, error) {
	return slices.SortedFunc(maps.Keys(k.addrs), netip.Addr.Compare), nil
}
func (k *fakeKernel) Delete() error { return nil }

func (k *fakeKernel) AddAddr(a netip.Addr) error {
	if k.addrs[a] {
		return fmt.Errorf("add %s to %s: %w", a, DummyName, syscall.EEXIST)
	}
	k.addrs[a] = true
	return nil
}

func (k *fakeKernel) DelAddr(a netip.Addr) error {
	if !k.addrs[a] {
		return fmt.Errorf("delete %s from %s: %w", a, DummyName, syscall.EADDRNOTAVAIL)
	}
	delete(k.addrs, a)
	return nil
}

// Restore applies ipset restore input as ipset does: each line in turn,
// stopping at the first that fails (without -exist, adding what is there
// or deleting what is not fails).
func (k *fakeKernel) Restore(_ context.Context, data []byte) error {
	for n, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		exist := slices.Contains(f, "-exist")
		fail := func(why string) error { return fmt.Errorf("ipset restore: line %d %q: %s", n+1, line, why) }
		set := k.sets[f[1]]
		if f[0] != "create" && set == nil {
			return fail("no such set")
		}
		switch f[0] {
		case "create":
			if set != nil && !exist {
				return fail("set exists")
			}
			if set == nil {
				k.sets[f[1]] = map[string]bool{}
			}
		case "flush":
			k.sets[f[1]] = map[string]bool{}
		case "add", "del":
			if len(f) < 3 {
				return fail("no entry")
			}
			if set[f[2]] == (f[0] == "add") && !exist {
				return fail("entry exists, or is missing")
			}
			if f[0] == "add" {
				set[f[2]] = true
			} else {
				delete(set, f[2])
			}
		case "swap":
			other := k.sets[f[2]]
			if len(f) < 3 || other == nil {
				return fail("no set to swap with")
			}
			k.sets[f[1]], k.sets[f[2]] = other, set
		case "destroy":
			delete(k.sets, f[1])
		default:
			return fail("unknown command")
		}
	}
	return nil
}

func (k *fakeKernel) List(context.Context) (map[string][]string, error) {
	out := map[string][]string{}
	for _, name := range allSetNames() {
		if es, ok := k.sets[name]; ok {
			out[name] = slices.Sorted(maps.Keys(es))
		}
	}
	return out, nil
}

// fakeRunner keeps the last iptables-restore input of its family; its
// tables read back empty, so every sync writes the jumps too.
type fakeRunner struct {
	k   *fakeKernel
	fam proxy.Family
}

func (r *fakeRunner) Flavor() iptables.Flavor { return iptables.FlavorNFT }
func (r *fakeRunner) Family() proxy.Family    { return r.fam }
func (r *fakeRunner) Restore(_ context.Context, data []byte) error {
	r.k.rules[r.fam] = string(data)
	return nil
}
func (r *fakeRunner) Save(context.Context, iptables.Table, bool) ([]byte, error) { return nil, nil }
