package migrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/kpproxy/kp/proxy"
)

// TakeOver is a proxy.SyncObserver that removes what else programmed this
// node's Services once kp's first sync has succeeded: upstream kube-proxy's
// rules in every mode (iptables and ipvs modes' chains in both iptables
// flavors and families, its nftables tables), and kp's own rules of the
// modes it is not running now (Others). It runs once per process.
type TakeOver struct {
	// Mode is the mode kp runs; its rules stay.
	Mode proxy.Mode
	// Others clean up kp's other modes, by mode; with keepActive, a mode
	// whose state carries connections (the ipvs mode's virtual servers
	// with established connections or UDP flows) keeps that part and says how much it kept.
	Others map[proxy.Mode]func(ctx context.Context, keepActive bool) (kept int, err error)
	Log    *slog.Logger
	// KeepActive keeps the IPVS virtual servers, kp's or kube-proxy's,
	// that still carry connections (see RemoveIdle); Run
	// reports them, and a later Run removes them once they are idle.
	KeepActive bool

	// NodePorts are the Services' NodePorts: kube-proxy's ipvs-mode
	// virtual servers on node addresses are recognised by them.
	NodePorts []NodePort
	// kubeProxyIPTables, kubeProxyIPVS and kubeProxyNFTables are the
	// finders (tests replace them).
	kubeProxyIPTables func(ctx context.Context, remove bool) ([]IPTablesFound, error)
	kubeProxyIPVS     func(ctx context.Context, how Removal, nodePorts []NodePort) (IPVSFound, error)
	kubeProxyNFTables func(remove bool) ([]NFTablesFound, error)

	once sync.Once
}

// Synced runs the take-over after the first successful sync; later syncs
// do nothing.
func (t *TakeOver) Synced(ctx context.Context, _, _ *proxy.State) {
	t.once.Do(func() {
		if _, err := t.Run(ctx); err != nil {
			t.Log.Warn("removing the leftovers of other proxies failed; they may still match packets", "err", err)
		}
	})
}

// Run removes the leftovers now and logs what it removed. It returns how
// many IPVS virtual servers it kept for their connections (KeepActive).
// Running the none mode (a node being handed back to kube-proxy), it
// removes kp's other modes only: kube-proxy's rules are the returning
// kube-proxy's.
func (t *TakeOver) Run(ctx context.Context) (kept int, err error) {
	if t.Mode == proxy.ModeNone {
		return t.removeOthers(ctx, 0, nil)
	}
	ipt, nft := t.kubeProxyIPTables, t.kubeProxyNFTables
	if ipt == nil {
		ipt = KubeProxyIPTables
	}
	if nft == nil {
		nft = KubeProxyNFTables
	}
	vs := t.kubeProxyIPVS
	if vs == nil {
		vs = KubeProxyIPVS
	}
	var errs []error
	iptFound, err := ipt(ctx, true)
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range iptFound {
		if f.Skipped == "" && (f.Chains > 0 || f.Jumps > 0 || len(f.Kept) > 0) {
			t.Log.Info("removed kube-proxy's iptables rules", "where", f.String())
		}
	}
	// After the iptables rules: an ipset a rule references cannot go.
	// kube-proxy's NodePort virtual servers sit on the node's own addresses,
	// where kp's ipvs mode serves the same NodePorts: running that mode, kp
	// keeps them (its sync rewrites them as its own) and removes the rest.
	nodePorts := t.NodePorts
	if t.Mode == proxy.ModeIPVS {
		nodePorts = nil
	}
	// Running the ipvs mode, kp's own virtual servers took over
	// kube-proxy's: nothing is kept for connections.
	how := RemoveAll
	if t.KeepActive && t.Mode != proxy.ModeIPVS {
		how = RemoveIdle
	}
	ipvsFound, err := vs(ctx, how, nodePorts)
	if err != nil {
		errs = append(errs, err)
	}
	kept = ipvsFound.Kept
	if !ipvsFound.empty() && ipvsFound.Skipped == "" {
		t.Log.Info("removed kube-proxy's ipvs-mode leftovers", "where", ipvsFound.String())
	}
	nftFound, err := nft(true)
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range nftFound {
		t.Log.Info("removed kube-proxy's nftables table", "where", f.String())
	}
	return t.removeOthers(ctx, kept, errs)
}

// removeOthers removes kp's rules of every mode but the running one, adding
// what they kept for connections to kept.
func (t *TakeOver) removeOthers(ctx context.Context, kept int, errs []error) (int, error) {
	for m, cleanup := range t.Others {
		if m == t.Mode {
			continue
		}
		n, err := cleanup(ctx, t.KeepActive)
		if err != nil {
			errs = append(errs, fmt.Errorf("remove kp's %s-mode rules: %w", m, err))
		}
		kept += n
	}
	return kept, errors.Join(errs...)
}
