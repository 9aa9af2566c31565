// Package conformance runs upstream's own Services tests (the e2e.test of
// the pinned Kubernetes, under ginkgo) against kp and against upstream
// kube-proxy on the same kind of real-node cluster (test/cluster), and keeps
// the results side by side in REPORT.md and results.json: one column per
// proxy and mode, so a mode added later (kp-iptables, kp-ipvs) is one more
// column.
//
// The run is TestConformance, which only runs with KP_CONFORMANCE=1
// (`make conformance`): it takes tens of minutes, and make test stays quick.
// This file's package holds the report's model (report.go), which make
// test checks with a fixture.
package conformance
