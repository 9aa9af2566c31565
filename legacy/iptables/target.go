package iptables

import "github.com/kpproxy/kp/proxy"

var _ proxy.TargetReporter = (*Backend)(nil)

// Target is the iptables mode with the flavor this backend writes.
func (b *Backend) Target() proxy.Target {
	return proxy.Target{Mode: proxy.ModeIPTables, IPTablesBackend: string(b.Flavor())}
}
