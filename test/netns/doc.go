// Package netns builds small worlds of network namespaces for kp's
// end-to-end tests: a node namespace where kp runs as a real process, pod
// namespaces behind a bridge each running an echo server, and a client
// namespace off the node.
//
//	client ──veth── node ──kpbr0── pod-0, pod-1, …
//
// Every world has its own namespaces with unique names, so tests may run in
// parallel, and everything a world made is removed when its test ends, pass,
// fail or panic. Addresses live only inside the namespaces; no route leads out
// of them (the node's default route points at the client, which does not
// forward).
//
// Addressing, with X the world's index (see World.Index):
//
//	pods            10.X.1.0/24   fd00:X:1::/64   gateway .1 / ::1 on kpbr0, pod-i at .10+i / ::10+i
//	node ↔ client   10.X.2.0/24   fd00:X:2::/64   node .1 / ::1, client .2 / ::2
//	Services        10.96.0.0/16  fd00:96::/112   routed from the client to the node
//
// Tests that use the harness call it from TestMain so the binaries it builds
// are removed afterwards:
//
//	func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }
package netns
