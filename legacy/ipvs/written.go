package ipvs

import (
	"net/netip"

	"github.com/kpproxy/kp/proxy"
)

// written is the IPVS state kp wrote for one family (its own record, not a
// read of the kernel): each service port's rendering, and what they add up
// to (several ports share a ClusterIP, endpoints share loop-back entries),
// counted so a change knows when the last user of an address or entry
// left.
type written struct {
	services map[proxy.ServicePortName]*rendered
	servers  map[vsKey]*VirtualServer
	addrs    map[netip.Addr]int
	entries  map[setEntry]int
	// nodeAddrs are the NodePort addresses the servers were rendered for.
	nodeAddrs []netip.Addr
}

func newWritten() *written {
	return &written{services: map[proxy.ServicePortName]*rendered{}, servers: map[vsKey]*VirtualServer{},
		addrs: map[netip.Addr]int{}, entries: map[setEntry]int{}}
}

// change is what replacing one service port's rendering changed: the
// virtual servers to reconcile, the addresses and set entries that
// appeared or went.
type change struct {
	servers       map[vsKey]*VirtualServer // nil value: delete
	addAddrs      []netip.Addr
	delAddrs      []netip.Addr
	addEntries    []setEntry
	delEntries    []setEntry
	serversOwners map[vsKey]proxy.ServicePortName
}

func newChange() *change {
	return &change{servers: map[vsKey]*VirtualServer{}, serversOwners: map[vsKey]proxy.ServicePortName{}}
}

// set replaces name's rendering with r (nil removes it) and records in c
// what that changed.
func (wr *written) set(name proxy.ServicePortName, r *rendered, c *change) {
	old := wr.services[name]
	if old != nil {
		for _, vs := range old.servers {
			if cur := wr.servers[vs.Key]; cur != nil && cur.Owner == name {
				delete(wr.servers, vs.Key)
				if _, ok := c.servers[vs.Key]; !ok {
					c.servers[vs.Key] = nil
					c.serversOwners[vs.Key] = name
				}
			}
		}
		for _, a := range old.addrs {
			if wr.addrs[a]--; wr.addrs[a] <= 0 {
				delete(wr.addrs, a)
				c.delAddrs = append(c.delAddrs, a)
			}
		}
		for _, e := range old.entries {
			if wr.entries[e]--; wr.entries[e] <= 0 {
				delete(wr.entries, e)
				c.delEntries = append(c.delEntries, e)
			}
		}
	}
	if r == nil {
		delete(wr.services, name)
		return
	}
	wr.services[name] = r
	for _, vs := range r.servers {
		wr.servers[vs.Key] = vs
		c.servers[vs.Key] = vs
		c.serversOwners[vs.Key] = name
	}
	for _, a := range r.addrs {
		if wr.addrs[a]++; wr.addrs[a] == 1 {
			c.addAddrs = append(c.addAddrs, a)
		}
	}
	for _, e := range r.entries {
		if wr.entries[e]++; wr.entries[e] == 1 {
			c.addEntries = append(c.addEntries, e)
		}
	}
}

// settle drops what a change both removed and added back (a service port
// re-rendered with the same ClusterIP): it stays in the kernel untouched.
func (c *change) settle() {
	c.addAddrs, c.delAddrs = cancelOut(c.addAddrs, c.delAddrs)
	c.addEntries, c.delEntries = cancelOut(c.addEntries, c.delEntries)
}

func cancelOut[T comparable](add, del []T) ([]T, []T) {
	if len(add) == 0 || len(del) == 0 {
		return add, del
	}
	in := map[T]int{}
	for _, a := range add {
		in[a]++
	}
	var keptDel []T
	for _, d := range del {
		if in[d] > 0 {
			in[d]--
			continue
		}
		keptDel = append(keptDel, d)
	}
	var keptAdd []T
	delIn := map[T]int{}
	for _, d := range del {
		delIn[d]++
	}
	for _, a := range add {
		if delIn[a] > 0 {
			delIn[a]--
			continue
		}
		keptAdd = append(keptAdd, a)
	}
	return keptAdd, keptDel
}
