// Package nodes holds kp's end-to-end tests on real nodes: a cluster of
// test/cluster (kube-apiserver, kube-controller-manager, kube-scheduler,
// two nodes with containerd and a kubelet) where kp is deployed with
// kubectl apply -k manifests/, as a user deploys it, and real pods behind
// real Services send traffic through it. A package of its own, so go test
// -p runs it beside the other end-to-end packages.
package nodes
