package migrate

import (
	"fmt"

	"github.com/google/nftables"
)

// kubeProxyNFTTable is the table upstream kube-proxy's nftables mode writes,
// in the ip and ip6 families; it holds nothing of anyone else's.
const kubeProxyNFTTable = "kube-proxy"

// NFTablesFound is a kube-proxy table found in the nftables ruleset.
type NFTablesFound struct {
	Family string // "ip", "ip6"
	Chains int
}

func (f NFTablesFound) String() string {
	return fmt.Sprintf("nftables table %s %s: %d chains", f.Family, kubeProxyNFTTable, f.Chains)
}

// KubeProxyNFTables finds upstream kube-proxy's nftables tables in the
// calling thread's network namespace and, when remove is set, deletes them
// in one transaction, as upstream's own cleanup does.
func KubeProxyNFTables(remove bool) ([]NFTablesFound, error) {
	conn, tables, err := listIPNFTables()
	if err != nil {
		return nil, err
	}
	defer conn.CloseLasting()
	var found []NFTablesFound
	for _, t := range tables {
		if t.Name != kubeProxyNFTTable {
			continue
		}
		f := NFTablesFound{Family: "ip"}
		if t.Family == nftables.TableFamilyIPv6 {
			f.Family = "ip6"
		}
		chains, err := conn.ListChainsOfTableFamily(t.Family)
		if err != nil {
			return found, fmt.Errorf("list chains of %s %s: %w", f.Family, t.Name, err)
		}
		for _, c := range chains {
			if c.Table.Name == t.Name {
				f.Chains++
			}
		}
		found = append(found, f)
		if remove {
			conn.DelTable(t)
		}
	}
	if remove && len(found) > 0 {
		if err := conn.Flush(); err != nil {
			return found, fmt.Errorf("delete kube-proxy's nftables tables: %w", err)
		}
	}
	return found, nil
}
