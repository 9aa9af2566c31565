// Package apiserver runs a real etcd and kube-apiserver for kp's tests.
//
// They live in a network namespace of their own (made with test/netns), bound
// to an address on a bridge inside it, never to 0.0.0.0 and never in the root
// namespace. A test connects the namespaces that must reach the API server
// (a world's node, where kp runs) with Connect, which adds a veth into that
// bridge; the test process itself reaches the server through a dialer that
// opens its sockets inside the API server's namespace.
//
//	node ns ──veth── [kpapi0 bridge: 10.250.N.1 = kube-apiserver :6443, :6444 …] ── etcd on 127.0.0.1
//
// N is the server's index in the test process (1…250), clear of the worlds'
// 10.100–249 and of the Service range 10.96.0.0/16.
//
// The binaries are the real ones, built from test/k8s (a nested module, so
// k8s.io/kubernetes never enters kp's go.mod) by test/k8s/build.sh into a
// cache directory (see BinDir); make builds them when they are missing.
//
// The API server authorises by RBAC, authenticates with a static token file
// (an admin in system:masters) and service account tokens, and signs those
// with a generated key. Nothing but the API server and etcd runs: no
// controller-manager, so tests create Services without selectors and write
// their EndpointSlices themselves.
package apiserver
