package nft

import (
	"context"

	"github.com/kpproxy/kp/proxy"
)

// DetectDrift implements proxy.DriftDetector from the kernel's own change
// events (monitor.go): a transaction another process sends that changes
// kp's tables (nft delete element, nft flush chain, a deleted table) is
// reported as soon as the kernel commits it, with the process the kernel
// names, and the next Sync reads the tables again and repairs them (as
// after a failed transaction). kp's own transactions are told apart by
// their socket. Off when cfg.DriftCheckPeriod is 0, and with a Conn that
// hears nothing (the Fake).
func (b *Backend) DetectDrift(ctx context.Context, drifted func(proxy.Drift)) error {
	w, ok := b.conn.(watcher)
	if !ok || b.cfg.DriftCheckPeriod <= 0 {
		return nil
	}
	return w.watch(ctx, func(d proxy.Drift) {
		b.drifted.Store(true)
		drifted(d)
	})
}

var _ proxy.DriftDetector = (*Backend)(nil)
