package migrate

import (
	"fmt"

	"github.com/google/nftables"
)

// listIPNFTables opens nftables in the calling thread's network namespace and
// lists its ip and ip6 tables (the families kp and kube-proxy write). The
// caller closes the connection.
func listIPNFTables() (*nftables.Conn, []*nftables.Table, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, nil, fmt.Errorf("nftables: %w", err)
	}
	tables, err := conn.ListTables()
	if err != nil {
		conn.CloseLasting()
		return nil, nil, fmt.Errorf("list nftables tables: %w", err)
	}
	out := tables[:0]
	for _, t := range tables {
		if t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6 {
			out = append(out, t)
		}
	}
	return conn, out, nil
}
