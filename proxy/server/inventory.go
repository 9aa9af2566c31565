package server

import (
	"context"
	"sync"
	"time"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// InventoryFunc lists what programs the node's Services in the kernel now
// (kp's rules and other proxies'); cmd/kp supplies migrate.Inventory.
type InventoryFunc func(ctx context.Context) ([]statusapi.Program, error)

// inventoryCache runs the inventory (which forks iptables-save for each
// flavor and family) one request at a time and serves a result younger
// than inventoryMaxAge to the requests that come meanwhile: a client
// polling it must not load the node.
type inventoryCache struct {
	list InventoryFunc
	node string

	mu   sync.Mutex
	last *statusapi.Inventory
}

const inventoryMaxAge = time.Second

func (c *inventoryCache) get(ctx context.Context) *statusapi.Inventory {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && time.Since(c.last.Time) < inventoryMaxAge {
		return c.last
	}
	inv := &statusapi.Inventory{APIVersion: "kp/" + statusapi.Version, Node: c.node, Time: time.Now(), Programs: []statusapi.Program{}}
	if c.list != nil {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		progs, err := c.list(ctx)
		if progs != nil {
			inv.Programs = progs
		}
		if err != nil {
			inv.Error = err.Error()
		}
	}
	inv.Time = time.Now() // when it was read: the age counts from the end
	c.last = inv
	return inv
}
