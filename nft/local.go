package nft

import (
	"net/netip"

	"github.com/google/nftables/expr"

	"github.com/kpproxy/kp/proxy"
)

// Local traffic: what upstream's --detect-local-mode calls traffic from
// this node's pods, and the decisions that hang on it.

// clusterMasquerade is the masquerade decision for traffic to a ClusterIP
// (to dst only, when valid): all of it with --masquerade-all, else what is
// not local traffic (so replies come back through this node); none when
// local traffic cannot be told (no local CIDR of the family).
func (b *Backend) clusterMasquerade(f family, dst netip.Addr, comment string) []Rule {
	rb := newRule(f)
	if dst.IsValid() {
		rb.addrIs(false, false, dst)
	}
	if !b.cfg.MasqueradeAll && !b.matchLocal(rb, f, true) {
		return nil
	}
	return []Rule{rb.verdict(expr.VerdictJump, chainMarkMasq).build(comment)}
}

// matchLocal adds to rb the match of local traffic (from this node's pods,
// upstream's detect-local modes; with neg, of the rest): its source in
// @cluster-cidrs, which holds the mode's CIDRs (ClusterCIDR, NodeCIDR), or
// the interface it came in on (BridgeInterface, InterfaceNamePrefix). It
// reports false, adding nothing, when local traffic cannot be told: no CIDR
// of the family.
func (b *Backend) matchLocal(rb *ruleBuilder, f family, neg bool) bool {
	if name, prefix, ok := b.cfg.LocalInterface(); ok {
		rb.iifname(name, prefix, neg)
		return true
	}
	if len(proxy.FilterPrefixes(f.pf, b.cfg.LocalCIDRs())) == 0 {
		return false
	}
	rb.addrInSet(true, neg, setClusterCIDRs)
	return true
}
