package ipvs

import (
	"fmt"
	"net/netip"

	"github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// opKind is one IPVS netlink operation.
type opKind int

const (
	opAddServer opKind = iota
	opUpdateServer
	opDelServer
	opAddDest
	opRestoreDest // a draining real server wanted again: weight 1
	opDrainDest   // weight 0; deleted once drained (graceful.go)
	opDelDest
)

var opNames = map[opKind]string{opAddServer: "add virtual server", opUpdateServer: "update virtual server",
	opDelServer: "delete virtual server", opAddDest: "add real server", opRestoreDest: "restore real server",
	opDrainDest: "drain real server", opDelDest: "delete real server"}

// op is one change to the kernel's IPVS table, as data: a sync's diff is a
// list of them, computed before anything is sent.
type op struct {
	kind  opKind
	key   vsKey
	vs    *VirtualServer // add and update
	dest  netip.AddrPort
	owner proxy.ServicePortName
}

func (o op) String() string {
	s := opNames[o.kind] + " " + o.key.String()
	if o.kind >= opAddDest {
		s += " -> " + o.dest.String()
	}
	return s
}

// kernelServer is one virtual server as the kernel holds it.
type kernelServer struct {
	svc   *ipvs.Service
	dests []*ipvs.Destination
	// procTimeout: read from /proc/net/ip_vs, whose persistence timeout
	// may be in jiffies (sameTimeout).
	procTimeout bool
}

// diffServer compares the virtual server kp wants at key (nil: none) with
// the kernel's (nil: absent). A real server kp no longer wants is drained
// when it still holds connections, deleted when it holds none.
func diffServer(key vsKey, want *VirtualServer, have *kernelServer, owner proxy.ServicePortName) []op {
	var ops []op
	if want == nil {
		if have != nil {
			ops = append(ops, op{kind: opDelServer, key: key, owner: owner})
		}
		return ops
	}
	owner = want.Owner
	var kdests map[netip.AddrPort]*ipvs.Destination
	if have == nil {
		ops = append(ops, op{kind: opAddServer, key: key, vs: want, owner: owner})
	} else {
		if !want.same(have.svc) {
			ops = append(ops, op{kind: opUpdateServer, key: key, vs: want, owner: owner})
		}
		kdests = map[netip.AddrPort]*ipvs.Destination{}
		for _, d := range have.dests {
			kdests[destAddrPort(d)] = d
		}
	}
	wanted := map[netip.AddrPort]bool{}
	for _, d := range want.Dests {
		wanted[d] = true
		switch k := kdests[d]; {
		case k == nil:
			ops = append(ops, op{kind: opAddDest, key: key, dest: d, owner: owner})
		case k.Weight != 1:
			ops = append(ops, op{kind: opRestoreDest, key: key, dest: d, owner: owner})
		}
	}
	if have != nil {
		for _, d := range have.dests {
			ap := destAddrPort(d)
			if wanted[ap] {
				continue
			}
			// As upstream: only TCP drains; a UDP or SCTP real server goes at
			// once (with expire_nodest_conn the kernel drops its entries at
			// their next packet, which IPVS then schedules anew).
			if d.ActiveConnections+d.InactiveConnections == 0 || key.Proto != v1.ProtocolTCP {
				ops = append(ops, op{kind: opDelDest, key: key, dest: ap, owner: owner})
			} else {
				ops = append(ops, op{kind: opDrainDest, key: key, dest: ap, owner: owner})
			}
		}
	}
	return ops
}

// apply sends one op. The error names the Service and the server.
func apply(h Handle, o op) error {
	var err error
	switch o.kind {
	case opAddServer:
		err = h.NewService(o.vs.service())
	case opUpdateServer:
		err = h.UpdateService(o.vs.service())
	case opDelServer:
		err = h.DelService(keyService(o.key))
	case opAddDest:
		err = h.NewDestination(keyService(o.key), destination(o.dest, 1))
	case opRestoreDest:
		err = h.UpdateDestination(keyService(o.key), destination(o.dest, 1))
	case opDrainDest:
		err = h.UpdateDestination(keyService(o.key), destination(o.dest, 0))
	case opDelDest:
		err = h.DelDestination(keyService(o.key), destination(o.dest, 0))
	}
	if err != nil {
		name := "an unknown service port"
		if o.owner != (proxy.ServicePortName{}) {
			name = "service port " + o.owner.String()
		}
		return fmt.Errorf("%s: %s: %w", name, o, err)
	}
	return nil
}
