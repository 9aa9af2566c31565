package migrate

import (
	"context"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// NodePortsOf lists st's NodePorts, by which kube-proxy's ipvs-mode virtual
// servers on node addresses are recognised.
func NodePortsOf(st *proxy.State) []NodePort {
	var out []NodePort
	for _, sp := range st.Services {
		if sp.NodePort == 0 {
			continue
		}
		out = append(out, NodePort{Protocol: uint16(proxy.ProtocolNumber(sp.Protocol)), Port: uint16(sp.NodePort)})
	}
	return out
}

// InventoryPrograms is Inventory as the status API's
// /kp/v1/inventory lists it.
func InventoryPrograms(ctx context.Context) ([]statusapi.Program, error) {
	found, err := Inventory(ctx)
	return programs(found), err
}
