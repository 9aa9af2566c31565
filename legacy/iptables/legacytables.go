package iptables

import (
	"errors"
	"io/fs"
	"os"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// legacyTablesFile is where the kernel lists the iptables-legacy tables of
// family f in a network namespace, one name a line: a table is there from
// the first use of it in that namespace (the kernel makes tables on demand)
// until the namespace goes, and no legacy rule exists outside one.
// thread-self, not self: a caller that entered another namespace did so on
// its own locked thread, and /proc/self/net is the main thread's.
func legacyTablesFile(f proxy.Family) string {
	if f == proxy.IPv6 {
		return "/proc/thread-self/net/ip6_tables_names"
	}
	return "/proc/thread-self/net/ip_tables_names"
}

// LegacyTables lists the iptables-legacy tables the kernel holds for family
// f in the calling thread's network namespace. Reading the list needs no
// capability (root reads the file); reading the tables does: iptables-legacy
// asks the kernel through a raw IP socket, which needs CAP_NET_RAW. So an
// empty list is the one thing kp can know about legacy iptables without
// NET_RAW: there is nothing to read, and nothing of kube-proxy's or kp's to
// remove. known is false when the list cannot be read (no
// /proc/thread-self/net): only iptables-legacy-save can tell then. With
// the file absent the kernel's ip_tables (ip6_tables) module is not
// loaded: no table.
func LegacyTables(f proxy.Family) (tables []string, known bool) {
	data, err := os.ReadFile(legacyTablesFile(f))
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat("/proc/thread-self/net"); err == nil {
			return nil, true
		}
		return nil, false
	}
	if err != nil {
		return nil, false
	}
	return strings.Fields(string(data)), true
}
