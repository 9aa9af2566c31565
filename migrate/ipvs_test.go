package migrate

import (
	"context"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/ipvs"

	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/vm"
)

// The take-over removes what upstream kube-proxy's ipvs mode leaves (its
// kube-ipvs0 interface, the IPVS virtual servers on its addresses and on
// the node's addresses at a Service's NodePort, its ipsets, after the
// iptables rules that reference them) and leaves another program's virtual
// servers and ipsets. It runs in the VM: the host kernel has no IPVS.
func TestKernelRemovesKubeProxysIPVSLeftoversOnly(t *testing.T) {
	if os.Getenv("KP_VM") != "1" {
		out, err := vm.RunPackage(t, vm.Options{Timeout: 8 * time.Minute}, "./migrate", "^TestKernelRemovesKubeProxysIPVSLeftoversOnly$")
		if err != nil {
			t.Fatalf("in the VM: %v\n%s", err, out)
		}
		for _, e := range vm.CheckRun(out, vm.Claim{Pass: []string{"TestKernelRemovesKubeProxysIPVSLeftoversOnly"}}) {
			t.Errorf("in the VM: %v", e)
		}
		if t.Failed() {
			t.Logf("the VM's output:\n%s", out)
		}
		return
	}
	netns.Require(t, "ipset", "iptables-nft-restore", "ip")
	ns := netns.NewNamespace(t, "ipvs")
	setup := `set -e
ip link add kube-ipvs0 type dummy
ip addr add 10.96.0.10/32 dev kube-ipvs0
ip addr add 10.96.0.11/32 dev kube-ipvs0
ip link add eth0 type dummy
ip addr add 10.0.0.1/24 dev eth0
ip link set eth0 up
ipset create KUBE-CLUSTER-IP hash:ip,port
ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:80
ipset create KUBE-6-CLUSTER-IP hash:ip,port family inet6
ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
ipset create OPERATOR hash:ip
iptables-nft -t nat -N KUBE-SERVICES
iptables-nft -t nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables-nft -t nat -A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
`
	if out, err := netns.Exec(ns, "sh", "-c", setup); err != nil {
		t.Fatalf("setup: %v\n%s", err, out)
	}
	type vs struct {
		ip    string
		proto uint16
		port  uint16
	}
	all := []vs{
		{"10.96.0.10", syscall.IPPROTO_TCP, 80},  // kube-proxy's: a ClusterIP on kube-ipvs0
		{"10.96.0.11", syscall.IPPROTO_UDP, 53},  // kube-proxy's
		{"10.0.0.1", syscall.IPPROTO_TCP, 30080}, // kube-proxy's: a NodePort on a node address
		{"10.0.0.1", syscall.IPPROTO_TCP, 8080},  // someone else's: a node address, not a NodePort
		{"10.200.0.1", syscall.IPPROTO_TCP, 80},  // someone else's
	}
	var left []string
	var found, again IPVSFound
	err := netns.InNamespace(ns, func() error {
		h, err := ipvs.New("")
		if err != nil {
			return err
		}
		defer h.Close()
		for _, v := range all {
			s := &ipvs.Service{Address: net.ParseIP(v.ip), Protocol: v.proto, Port: v.port,
				AddressFamily: syscall.AF_INET, SchedName: "rr", Netmask: 0xffffffff}
			if err := h.NewService(s); err != nil {
				return err
			}
		}
		ctx := context.Background()
		if _, err := KubeProxyIPTables(ctx, true); err != nil {
			return err
		}
		if found, err = KubeProxyIPVS(ctx, RemoveAll, []NodePort{{Protocol: syscall.IPPROTO_TCP, Port: 30080}}); err != nil {
			return err
		}
		svcs, err := h.GetServices()
		if err != nil {
			return err
		}
		for _, s := range svcs {
			left = append(left, net.JoinHostPort(s.Address.String(), strconv.Itoa(int(s.Port))))
		}
		again, err = KubeProxyIPVS(ctx, RemoveAll, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(left)
	if want := []string{"10.0.0.1:8080", "10.200.0.1:80"}; !slices.Equal(left, want) {
		t.Errorf("virtual servers left: %v, want %v", left, want)
	}
	slices.Sort(found.IPSets)
	if !found.Interface || found.VirtualServers != 3 || !slices.Equal(found.IPSets, []string{"KUBE-6-CLUSTER-IP", "KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP"}) {
		t.Errorf("found %s", found)
	}
	if !again.empty() {
		t.Errorf("second run found %s", again)
	}
	if out, _ := netns.Exec(ns, "ipset", "list", "-n"); strings.TrimSpace(out) != "OPERATOR" {
		t.Errorf("ipsets left: %q, want OPERATOR", out)
	}
	if out, _ := netns.Exec(ns, "ip", "link", "show", "kube-ipvs0"); !strings.Contains(out, "does not exist") {
		t.Errorf("kube-ipvs0 left: %s", out)
	}
}
