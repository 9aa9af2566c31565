package migrate

import (
	"context"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// NodePortsOf lists st's NodePorts, by which kube-proxy's ipvs-mode virtual
// servers on node addresses are recognised.
func NodePortsOf(st *proxy.State) []NodePort {
	var out []NodePort
	for _, sp := range st.Services {
		if sp.NodePort == 0 {
			continue
		}
		proto := uint16(unix.IPPROTO_TCP)
		switch sp.Protocol {
		case v1.ProtocolUDP:
			proto = unix.IPPROTO_UDP
		case v1.ProtocolSCTP:
			proto = unix.IPPROTO_SCTP
		}
		out = append(out, NodePort{Protocol: proto, Port: uint16(sp.NodePort)})
	}
	return out
}

// InventoryPrograms is Inventory as the status API's
// /kp/v1/inventory lists it.
func InventoryPrograms(ctx context.Context) ([]statusapi.Program, error) {
	found, err := Inventory(ctx)
	out := make([]statusapi.Program, 0, len(found))
	for _, f := range found {
		out = append(out, statusapi.Program{Owner: f.Owner, Mode: f.Mode, Where: f.Where, Chains: f.Chains,
			Rules: f.Rules, Elements: f.Elements, VirtualServers: f.VirtualServers})
	}
	return out, err
}
