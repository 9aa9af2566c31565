package nft

import (
	"context"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Probe checks that this kernel runs what kp writes: it creates a throwaway
// table with a verdict map and a numgen dispatch and deletes it again in the
// same transaction, so nothing is left behind whatever the outcome.
func (b *Backend) Probe(ctx context.Context) error {
	conn, err := (&netlinkConn{nsFd: b.probeNsFd}).open()
	if err != nil {
		return fmt.Errorf("nftables probe: open netlink: %w", err)
	}
	t := conn.AddTable(&nftables.Table{Name: "kp-probe", Family: nftables.TableFamilyIPv4})
	target := conn.AddChain(&nftables.Chain{Name: "target", Table: t})
	prio := nftables.ChainPriorityNATDest
	base := conn.AddChain(&nftables.Chain{Name: "probe", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: prio})
	m := &nftables.Set{Table: t, Name: "probe-map", IsMap: true, Concatenation: true,
		KeyType:  nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService),
		DataType: nftables.TypeVerdict}
	if err := conn.AddSet(m, nil); err != nil {
		return fmt.Errorf("nftables probe: %w", err)
	}
	conn.AddRule(&nftables.Rule{Table: t, Chain: base, Exprs: []expr.Any{
		&expr.Numgen{Register: 1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: target.Name},
	}})
	conn.DelTable(t)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables probe: the kernel refused kp's rule types (nf_tables with nat, numgen and verdict maps is required): %w", err)
	}
	return nil
}
