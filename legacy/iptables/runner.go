package iptables

import (
	"context"
	"fmt"

	"github.com/kpproxy/kp/proxy"
)

// Flavor is one of the two iptables backends Debian (and every distribution)
// ships: the iptables-nft and the iptables-legacy binaries.
type Flavor string

const (
	FlavorNFT    Flavor = "nft"
	FlavorLegacy Flavor = "legacy"
)

// Table is an iptables table kp writes to.
type Table string

const (
	TableNAT    Table = "nat"
	TableFilter Table = "filter"
	TableMangle Table = "mangle"
)

// Runner speaks to one iptables backend for one IP family, through its
// iptables-restore and iptables-save binaries (iptables-nft-restore,
// ip6tables-legacy-save, ...). It runs them in the calling process's network
// namespace. Implementations are safe for use by one goroutine at a time.
type Runner interface {
	Flavor() Flavor
	Family() proxy.Family
	// Restore feeds data, a complete iptables-restore input (one or more
	// "*table ... COMMIT" blocks), to iptables-restore --noflush --wait.
	// The kernel applies each table's block atomically or not at all. When
	// iptables-restore refuses the input, the error is a *RestoreError.
	Restore(ctx context.Context, data []byte) error
	// Save returns iptables-save's output for one table, with counters
	// (-c) when counters is set.
	Save(ctx context.Context, table Table, counters bool) ([]byte, error)
}

// RestoreError is iptables-restore refusing an input: the line it names
// (1-based, in the input kp sent; 0 when it named none) and what it said.
type RestoreError struct {
	Flavor Flavor
	Family proxy.Family
	Line   int
	// Text is the input line Line names, "" when unknown.
	Text   string
	Stderr string
	// Crashed: iptables-restore died of a signal instead of refusing.
	Crashed bool
}

func (e *RestoreError) Error() string {
	bin := restoreBinary(e.Flavor, e.Family)
	if e.Line > 0 {
		return fmt.Sprintf("%s refused line %d %q: %s", bin, e.Line, e.Text, e.Stderr)
	}
	return fmt.Sprintf("%s failed: %s", bin, e.Stderr)
}

// restoreBinary is the iptables-restore binary of flavor and family, as
// Debian names them.
func restoreBinary(fl Flavor, f proxy.Family) string {
	prefix := "iptables"
	if f == proxy.IPv6 {
		prefix = "ip6tables"
	}
	return prefix + "-" + string(fl) + "-restore"
}
