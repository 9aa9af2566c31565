// Package cluster drives kp migrate cluster: a whole cluster moved node by
// node, through the API server, from upstream kube-proxy to kp
// (FromKubeProxy) or from one kp mode to another (To), with each node's
// step gated on that node's kp being ready and synced in the new mode, a
// pause on the first failure, resume, and rollback.
//
// Everything the rollout knows lives on the Nodes, so a re-run of the same
// command resumes where the last one stopped and needs no local file:
//
//   - label kpproxy.io/proxy decides which proxy's DaemonSet runs on the
//     node: kube-proxy (kube-proxy's DaemonSet, patched by the rollout to
//     require it), kp (kp's DaemonSet, which runs wherever the label is not
//     kube-proxy: a cluster without kube-proxy needs no label), handback
//     (both: a node being given back to kube-proxy by a rollback);
//   - annotation kpproxy.io/proxy-mode is the mode kp runs there (the
//     running kp switches when it changes; proxy.AnnotationProxyMode);
//   - annotation kpproxy.io/migration is this package's record of the node
//     (Record): which rollout, its phase (running, done, failed), the step
//     and error of a failure, the mode and annotation before the rollout
//     (for rollback).
//
// A node's kp is read as kubectl exec reads it (PodExec): kp status -o
// json (mode, health, last sync, last mode switch) and kp status
// --inventory -o json (what programs the node's Services in the kernel:
// kube-proxy's rules, kp's), run in the node's kp pod through the API
// server's pods/exec. kp serves both on a Unix socket only root on the node
// opens, never on the network (issue 34), so the caller's RBAC (create
// pods/exec in kp's namespace) is the gate, and the API server audits it.
// Publishing the status on the API server instead (a Node annotation or a
// custom resource) would give kp's own ServiceAccount write access on every
// node (it has none today), put every node's state in etcd, and lag.
// Reading kp's own view is what makes the gate robust: it is the process
// that programs the kernel saying what it programmed, not a Pod condition
// (Ready only says /healthz answered) nor something kp would have to write
// to the API server (its RBAC is read-only, and a write can lag or fail on
// its own).
//
// Handing a node back to kube-proxy (rollback of FromKubeProxy) has no gap
// and no fight: label handback (kube-proxy's pod starts next to kp's and
// programs its rules; kp does not touch them, its take-over ran at its
// start), gate on kube-proxy's pod running and its rules in the kernel (as
// kp's inventory lists them), then annotation kpproxy.io/proxy-mode=none
// (kp removes its own rules and, in that mode, takes nothing over; kp
// refuses it unless it runs with --allow-mode-none, and the gate then
// fails with kp's reason), gate
// on kp reporting mode none with none of its rules left and kube-proxy's
// still there, then label kube-proxy (kp's pod leaves, with nothing of its
// own in the kernel), and the annotations go. kube-proxy's healthz is not
// the gate: while both run on a node kp holds port 10256, so kube-proxy's
// health server cannot bind it until kp leaves (upstream retries it).
package cluster
