// Package ipvs is kp's ipvs mode, with upstream kube-proxy's ipvs layout
// under kp's own names: a dummy interface kp-ipvs0 holding the ClusterIPs,
// externalIPs and LoadBalancer IPs; an IPVS virtual server per Service
// address and port (NodePorts on the node's addresses) with a real server
// per endpoint the core selects; ipsets (KP-CLUSTER-IP, KP-NODE-PORT-TCP,
// ...) written with one `ipset restore`, and iptables chains under
// KP-IPVS- (written through legacy/iptables) for masquerade, source ranges,
// the VIP access filter and the entry points.
//
// A sync is render, diff, apply: a State renders into plain values
// (VirtualServer, set entries, addresses; render.go), recorded per family
// as what kp wrote (written.go); those are compared with what the kernel
// holds, read back through netlink, as a list of ops (diffServer, diff.go),
// and only the differences are sent (apply in diff.go, driven by sync.go,
// with the ipset restore inputs of sets.go and the chains of rules.go). A
// real server that is no longer wanted is drained, not cut: weight 0,
// deleted once it holds no connection or after a bound (graceful.go).
package ipvs
