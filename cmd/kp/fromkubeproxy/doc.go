// Package fromkubeproxy knows what changes when kp replaces upstream
// kube-proxy on a cluster: kp migrate cluster --from-kube-proxy's preflight
// (--dry-run) and kp's ConfigMap written from kube-proxy's (--print-config).
//
// It reads, through the API server (kp cannot exec on nodes):
//
//   - kube-proxy's configuration where its DaemonSet says it is: the
//     --config file's ConfigMap and key (kubeadm's kube-system/kube-proxy,
//     config.conf; another name or key when its volume says so), or, without
//     --config, the flags (options.ParseKubeProxyArgs); the API server its
//     kubeconfig names (a ConfigMap key too, kubeadm's kubeconfig.conf);
//   - kp's ConfigMap when it exists (kube-system/kp, or what kp's DaemonSet
//     mounts): what kp will really run with. When it does not exist yet, the
//     preflight describes the one --print-config writes;
//   - the Nodes: their addresses, podCIDRs and CPUs; kubeadm-config's pod
//     subnet, for a clusterCIDR kube-proxy did not set.
//
// Both configurations go through kp's own decoder
// (options.DecodeKubeProxyConfiguration). What kube-proxy does with its
// configuration is upstream's rules (upstream.go, each with where upstream
// says it); what kp does is options.SettingsFromConfig — kp proxy's own
// merge, for the target mode as a switch builds it — read through the
// rules of kp's backends (kp.go). The preflight compares the two, item by
// item (items.go, items_node.go): per item what kube-proxy does, what kp
// in the target mode will do, a severity and, when there is something to
// do, what.
//
// Source code organization:
//
//   - cluster.go: Read, what the API server says (Cluster);
//   - volumes.go: which ConfigMap key a path in a container is;
//   - upstream.go, kp.go: each proxy's behaviour from its configuration;
//   - items.go, items_node.go: the preflight's items;
//   - report.go: the Report, as text and JSON;
//   - printconfig.go: kp's ConfigMap from kube-proxy's.
package fromkubeproxy
