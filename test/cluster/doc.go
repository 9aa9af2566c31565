// Package cluster runs a real Kubernetes cluster for kp's tests: the API
// server of test/apiserver, kube-controller-manager and kube-scheduler
// beside it, and N nodes, each a network namespace running containerd (with
// runc and the bridge CNI plugin) and a kubelet, all v1.36.3 binaries built
// by test/k8s. Pods are real containers; kp runs on it as a DaemonSet, as a
// user deploys it.
//
//	                 api namespace: etcd, kube-apiserver 10.250.N.1,
//	                 kube-controller-manager, kube-scheduler
//	                        │ bridge kpapi0 (the node network)
//	        ┌───────────────┴───────────────┐
//	node-1 10.250.N.2                  node-2 10.250.N.3         (network namespaces)
//	containerd + kubelet               containerd + kubelet
//	cbr0 10.251.1.1/24 ── pods         cbr0 10.251.2.1/24 ── pods
//
// Each node routes the other nodes' pod ranges to them; the API server's
// namespace routes every pod range back; a node's default route points at
// the API server's namespace, which does not forward: no packet leaves the
// test's namespaces. The root namespace's routes and firewall are never
// touched.
//
// What a node makes outside its namespace lives under /var/lib/kp-test/NS
// (NS its namespace's name: kpt-PID-nodeK) and in the cgroup /NS of every
// hierarchy, and all of it goes when the test ends, pass, fail or panic:
// every process of the node (kubelet, containerd, shims, runc, containers:
// found through the node's cgroups, so none escapes by double forking),
// every mount under its folder (overlays, tmpfs volumes, the pods' network
// namespaces), its cgroups, containerd's shim sockets, CNI's cached results.
// A killed run's leftovers are swept at the next Start (see SweepStale).
// The kernel settings the kubelet rewrites at start (vm.overcommit_memory,
// kernel.panic, …) are restored when the last cluster of the process ends.
//
// Pitfalls this package handles, each verified on the CI machine's kind
// (Debian 12 userland, cgroup v1 host): the kubelet refuses cgroup v1
// unless failCgroupV1 is false; root lacks CAP_SYS_RESOURCE, so containerd
// must not raise oom_score_adj (restrict_oom_score_adj); kubelet and
// containerd must share a mount namespace (nsenter --net, never ip netns
// exec); images are Docker tarballs imported with ctr under dotted names
// (kp.local/...) and never pulled; image garbage collection is off.
//
// Containerd is Debian's 1.6 (apt-get install containerd): installing it
// costs CI seconds where building v2 from the Go module proxy costs
// minutes, and 1.6 speaks the CRI v1 the kubelet needs. Its one known
// complaint (the kubelet asking for the runtime's cgroup driver, an RPC 1.6
// lacks) is logged and harmless.
//
// The kubelets authenticate with the API server's admin token (group
// system:masters): the API server authorises by RBAC only, without the Node
// authorizer, so nodes need no identities of their own.
package cluster
