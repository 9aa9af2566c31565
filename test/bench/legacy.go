package bench

import "slices"

// The iptables-legacy pair: kp's iptables mode and upstream's, each writing
// through iptables-legacy (x_tables) rather than iptables-nft, as on a node
// whose `iptables` is the legacy one. kp-iptables-legacy is given
// --iptables-backend legacy; upstream's kube-proxy runs iptables,
// iptables-save and iptables-restore (and the ip6tables ones) by those
// names from its PATH (k8s.io/kubernetes pkg/util/iptables: it does not
// choose a backend, the node's `iptables` does), so it is started with a
// PATH whose first folder holds those names as links to the -legacy
// binaries (legacy_test.go). The pair has no churn phases: a churn change is
// timed to the nf_tables event naming it (nft monitor), and x_tables
// writes none.

// isIPTablesLegacy says whether proxy is one of the iptables-legacy pair.
func isIPTablesLegacy(proxy string) bool {
	return proxy == KPIPTablesLegacy || proxy == UpstreamIPTablesLegacy
}

// legacyMachineNote is what the report's machine table says of the
// iptables-legacy pair, "" when the run measured neither.
func legacyMachineNote(r *Results) string {
	if !slices.ContainsFunc(r.proxies(), isIPTablesLegacy) {
		return ""
	}
	return "; " + KPIPTablesLegacy + " and " + UpstreamIPTablesLegacy + " write through iptables-legacy instead (kp with " +
		"`--iptables-backend legacy`, upstream with a PATH whose `iptables`, `iptables-save` and `iptables-restore`, " +
		"and the ip6tables ones, are iptables-legacy's); that pair has no churn phases, which time each change to its " +
		"nf_tables event and x_tables writes none"
}
