package nft

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// scaleState is n ClusterIP Services of m endpoints each (up to 100,000s:
// ClusterIPs from 10.96.0.1 on, endpoints from 10.128.0.1 on, 16 addresses
// per Service).
func scaleState(n, m int) *proxy.State {
	w := newWorld()
	addr := func(base uint32) string {
		return netip.AddrFrom4([4]byte{byte(base >> 24), byte(base >> 16), byte(base >> 8), byte(base)}).String()
	}
	for i := range n {
		var eps []string
		for j := range m {
			eps = append(eps, addr(10<<24|128<<16+uint32(i*16+j+1))+":8080")
		}
		w.AddService(statetest.PortName("ns", fmt.Sprintf("svc%d", i), "p", v1.ProtocolTCP), addr(10<<24|96<<16+uint32(i+1)), 80, 0, eps...)
	}
	return w.Next()
}

// benchServices sizes the full-sync benchmarks: -args -bench.services=10000.
var benchServices = flag.Int("bench.services", 1000, "Services (of 10 endpoints) in the full-sync benchmarks")

// BenchmarkFullSync renders and diffs a full sync of 1,000 Services of 10
// endpoints against the fake kernel: kp's own cost, without netlink.
func BenchmarkFullSync(b *testing.B) {
	s := scaleState(*benchServices, 10)
	b.ReportAllocs()
	for b.Loop() {
		fake := NewFake()
		be, err := newBackend(testConfig(), nil, fake)
		if err != nil {
			b.Fatal(err)
		}
		fake.LastOps = 0
		if err := be.Sync(b.Context(), s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFullSyncKernel is the same full sync into a real table, in a
// throwaway network namespace. Its metrics split off the kernel's share:
// the wall time of the transactions (apply-s) and the system CPU of the
// thread that sends them (kernel-s: nfnetlink applies a batch in the
// sender's context).
func BenchmarkFullSyncKernel(b *testing.B) {
	s := scaleState(*benchServices, 10)
	b.ReportAllocs()
	var applies applyTimer
	for b.Loop() {
		b.StopTimer()
		name := fmt.Sprintf("kp-bench-%d", os.Getpid())
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			b.Fatalf("%v %s", err, out)
		}
		fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		be, err := NewInNamespace(testConfig(), nil, fd)
		if err != nil {
			b.Fatal(err)
		}
		applies.Conn = be.conn
		be.conn = &applies
		b.StartTimer()
		err = be.Sync(b.Context(), s)
		b.StopTimer()
		unix.Close(fd)
		_ = exec.Command("ip", "netns", "del", name).Run()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(applies.wall.Seconds()/float64(b.N), "apply-s/op")
	b.ReportMetric(applies.sys.Seconds()/float64(b.N), "kernel-s/op")
}

// applyTimer times the transactions applied through it: their wall time,
// and the system CPU of the thread that sends them.
type applyTimer struct {
	Conn
	wall, sys time.Duration
}

func (c *applyTimer) Stream() (*Transaction, error) { return c.Conn.(streamer).Stream() }

func (c *applyTimer) Apply(tx *Transaction) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, after unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &before)
	start := time.Now()
	err := c.Conn.Apply(tx)
	c.wall += time.Since(start)
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &after)
	c.sys += time.Duration(after.Stime.Nano() - before.Stime.Nano())
	return err
}

// nullConn accepts every transaction and holds nothing.
type nullConn struct{}

func (nullConn) Apply(*Transaction) error          { return nil }
func (nullConn) Read(family) (*tableRecord, error) { return nil, nil }
func (nullConn) DNATCounters(family, []string) (map[string]map[netip.AddrPort]Counter, error) {
	return nil, nil
}
func (nullConn) ElementCounters(family, string) (map[string]Counter, error) { return nil, nil }
func (nullConn) TimedElements(family, string) ([]TimedElement, error)       { return nil, nil }

// BenchmarkEndpointChangeKernel is one endpoint change (a partial sync)
// with -bench.services Services of 10 endpoints in a real table: kp's time
// from a changed State to the kernel's answer.
func BenchmarkEndpointChangeKernel(b *testing.B) {
	benchEndpointChanges(b, func(k int, eps []proxy.Endpoint) []proxy.Endpoint {
		next := slices.Clone(eps)
		next[0].IP = netip.AddrFrom4([4]byte{172, 31, byte(k >> 8), byte(k)})
		return next
	})
}

// BenchmarkEndpointCountChangeKernel adds or removes one endpoint of one
// Service (10 ↔ 11) with -bench.services Services of 10 endpoints in a real
// table: the Service's chain is rewritten ("mod n" changes) besides the
// element.
func BenchmarkEndpointCountChangeKernel(b *testing.B) {
	benchEndpointChanges(b, func(k int, eps []proxy.Endpoint) []proxy.Endpoint {
		next := slices.Clone(eps)
		if k%2 == 1 {
			extra := eps[0]
			extra.IP = netip.AddrFrom4([4]byte{172, 30, 0, 1})
			next = append(next, extra)
		}
		return next
	})
}

// benchEndpointChanges syncs -bench.services Services of 10 endpoints into
// a real table, then times partial syncs of one Service whose endpoints
// change(k, the first endpoints) gives at the k-th change.
func benchEndpointChanges(b *testing.B, change func(k int, eps []proxy.Endpoint) []proxy.Endpoint) {
	_, _, be := kernelBackend(b)
	s := scaleState(*benchServices, 10)
	if err := be.Sync(b.Context(), s); err != nil {
		b.Fatal(err)
	}
	target := statetest.PortName("ns", "svc7", "p", v1.ProtocolTCP)
	eps := s.Endpoints[target]
	k := 0
	for b.Loop() {
		b.StopTimer()
		k++
		s.Endpoints[target] = change(k, eps)
		s.Generation++
		s.Changed = map[proxy.ServicePortName]struct{}{target: {}}
		b.StartTimer()
		if err := be.Sync(b.Context(), s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkListingReloadKernel times `nft -f` of the listing of a full
// sync of -bench.services Services of 10 endpoints into a fresh namespace:
// the kernel's share of a cold start (plus nft's own parsing), with the
// nft process's user and system CPU as metrics.
func BenchmarkListingReloadKernel(b *testing.B) {
	ns, _, be := kernelBackend(b)
	if err := be.Sync(b.Context(), scaleState(*benchServices, 10)); err != nil {
		b.Fatal(err)
	}
	listing, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "ip", TableName).Output()
	if err != nil {
		b.Fatal(err)
	}
	path := b.TempDir() + "/ruleset.nft"
	if err := os.WriteFile(path, listing, 0o644); err != nil {
		b.Fatal(err)
	}
	var user, sys float64
	for b.Loop() {
		b.StopTimer()
		fresh, _ := testNetns(b)
		cmd := exec.Command("ip", "netns", "exec", fresh, "nft", "-f", path)
		b.StartTimer()
		out, err := cmd.CombinedOutput()
		b.StopTimer()
		if err != nil {
			b.Fatalf("nft -f: %v\n%s", err, out)
		}
		user += cmd.ProcessState.UserTime().Seconds()
		sys += cmd.ProcessState.SystemTime().Seconds()
		_ = exec.Command("ip", "netns", "del", fresh).Run()
		b.StartTimer()
	}
	b.ReportMetric(user/float64(b.N), "user-s/op")
	b.ReportMetric(sys/float64(b.N), "sys-s/op")
	b.ReportMetric(float64(len(listing)), "listing-bytes")
}
