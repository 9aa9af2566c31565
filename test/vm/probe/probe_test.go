package probe

import (
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/test/netns"
)

// inVM skips t outside the VM: these tests need the 6.1 kernel's modules.
func inVM(t *testing.T) {
	t.Helper()
	if os.Getenv("KP_VM") != "1" {
		t.Skip("skipped: runs inside the VM (test/vm's TestProbe boots it)")
	}
}

// TestCryptoSelfTestsAreOff: the kernel skipped its crypto self-tests at
// boot (test/vm's cryptomgr.notests), which once took a loaded machine's
// whole boot deadline under emulation.
func TestCryptoSelfTestsAreOff(t *testing.T) {
	inVM(t)
	b, err := os.ReadFile("/sys/module/cryptomgr/parameters/notests")
	if err != nil {
		t.Fatal(err)
	}
	if v := strings.TrimSpace(string(b)); v != "Y" {
		t.Fatalf("cryptomgr.notests = %s, want Y", v)
	}
}

func TestKernelIs61(t *testing.T) {
	inVM(t)
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if !strings.HasPrefix(release, "6.1.") {
		t.Fatalf("uname -r = %q, want 6.1.*", release)
	}
	t.Logf("kernel %s", release)
}

func TestIPVSVirtualServerReadsBack(t *testing.T) {
	inVM(t)
	ns := netns.NewNamespace(t, "ipvs")
	err := netns.InNamespace(ns, func() error {
		h, err := ipvs.New("")
		if err != nil {
			return err
		}
		defer h.Close()
		for _, sched := range []string{"rr", "wrr", "lc", "sh", "mh"} {
			svc := &ipvs.Service{
				Address: net.ParseIP("10.96.0.10"), Protocol: syscall.IPPROTO_TCP, Port: 80,
				AddressFamily: syscall.AF_INET, SchedName: sched, Netmask: 0xffffffff,
			}
			if err := h.NewService(svc); err != nil {
				t.Errorf("scheduler %s: new service: %v", sched, err)
				continue
			}
			dst := &ipvs.Destination{Address: net.ParseIP("10.244.0.2"), Port: 8080, Weight: 1, AddressFamily: syscall.AF_INET}
			if err := h.NewDestination(svc, dst); err != nil {
				t.Errorf("scheduler %s: new destination: %v", sched, err)
			}
			got, err := h.GetServices()
			if err != nil {
				return err
			}
			if len(got) != 1 || !got[0].Address.Equal(svc.Address) || got[0].Port != 80 || got[0].SchedName != sched {
				t.Errorf("scheduler %s: read back %+v, want one 10.96.0.10:80 %s", sched, got, sched)
			} else if dsts, err := h.GetDestinations(got[0]); err != nil || len(dsts) != 1 || dsts[0].Port != 8080 {
				t.Errorf("scheduler %s: destinations %+v (%v), want 10.244.0.2:8080", sched, dsts, err)
			}
			if err := h.DelService(svc); err != nil {
				t.Errorf("scheduler %s: delete: %v", sched, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestNetnsTools(t *testing.T) {
	inVM(t)
	for _, tc := range []struct {
		name  string
		cmds  [][]string
		check []string // the last command's output holds each
	}{{
		name: "dummy interface holds an address",
		cmds: [][]string{
			{"ip", "link", "add", "kp-ipvs0", "type", "dummy"},
			{"ip", "addr", "add", "10.96.0.10/32", "dev", "kp-ipvs0"},
			{"ip", "-br", "addr", "show", "kp-ipvs0"},
		},
		check: []string{"kp-ipvs0", "10.96.0.10/32"},
	}, {
		name: "nftables table with a nat chain",
		cmds: [][]string{
			{"nft", "add table ip kp; add chain ip kp pre { type nat hook prerouting priority -100; }; add rule ip kp pre tcp dport 80 dnat to 10.244.0.2:8080"},
			{"nft", "list", "table", "ip", "kp"},
		},
		check: []string{"dnat to 10.244.0.2:8080"},
	}, {
		name: "iptables-nft nat rule",
		cmds: [][]string{
			{"iptables-nft", "-t", "nat", "-N", "KP-TEST"},
			{"iptables-nft", "-t", "nat", "-A", "KP-TEST", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.244.0.2:8080"},
			{"iptables-nft-save", "-t", "nat"},
		},
		check: []string{"-A KP-TEST", "--to-destination 10.244.0.2:8080"},
	}, {
		name: "iptables-legacy nat rule",
		cmds: [][]string{
			{"iptables-legacy", "-t", "nat", "-N", "KP-TEST"},
			{"iptables-legacy", "-t", "nat", "-A", "KP-TEST", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.244.0.2:8080"},
			{"iptables-legacy-save", "-t", "nat"},
		},
		check: []string{"-A KP-TEST", "--to-destination 10.244.0.2:8080"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.NewNamespace(t, "tools")
			var out string
			for _, c := range tc.cmds {
				var err error
				if out, err = netns.Exec(ns, c...); err != nil {
					t.Fatal(err)
				}
			}
			for _, want := range tc.check {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
