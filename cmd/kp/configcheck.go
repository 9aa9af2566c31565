package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
)

// placeholderServer is the API server address manifests/configmap.yaml
// ships in kubeconfig.conf, for the operator to replace.
const placeholderServer = "CONTROL-PLANE-ENDPOINT"

// configMapHint says where what kp read comes from in a cluster, and what
// writes it.
const configMapHint = "in kp's ConfigMap (kube-system/kp in manifests/), key %s; kp migrate cluster --from-kube-proxy --print-config " +
	"writes the ConfigMap from kube-proxy's"

// checkShippedConfig refuses to start kp proxy on what kp's ConfigMap
// (manifests/configmap.yaml) leaves for the operator to fill in, naming the
// field and the ConfigMap key: the kubeconfig's server still the
// placeholder, which resolves to nothing, so kp would retry the API server
// for ever. (The clusterCIDR placeholder is refused where the file is read,
// cmd/kp/options, so kp sysctl in the init container refuses it first.)
// It also returns a warning for an empty clusterCIDR with detectLocalMode
// ClusterCIDR (the default), as kube-proxy warns and runs: kp cannot tell
// pods from other clients then. kube-proxy runs so on EKS, whose
// configuration kp takes as it is.
func checkShippedConfig(s options.Settings) (warning string, err error) {
	cfg := s.Config
	if cfg.ManifestsDir != "" {
		return "", nil
	}
	if cfg.Master == "" && cfg.Kubeconfig != "" {
		// A kubeconfig kp cannot read is client-go's to report.
		if kc, err := clientcmd.LoadFromFile(cfg.Kubeconfig); err == nil {
			server := ""
			if ctx := kc.Contexts[kc.CurrentContext]; ctx != nil && kc.Clusters[ctx.Cluster] != nil {
				server = kc.Clusters[ctx.Cluster].Server
			}
			if strings.Contains(server, placeholderServer) {
				return "", fmt.Errorf("kubeconfig %s: the API server's address is still manifests/configmap.yaml's placeholder (server: %s): "+
					"set the cluster's server to the API server's real address (not the kubernetes Service's ClusterIP) "+configMapHint,
					cfg.Kubeconfig, server, filepath.Base(cfg.Kubeconfig))
			}
		}
	}
	byClusterCIDR := cfg.DetectLocal.Mode == "" || cfg.DetectLocal.Mode == proxy.LocalModeClusterCIDR
	if byClusterCIDR && len(cfg.ClusterCIDRs) == 0 && cfg.Mode != proxy.ModeNone {
		return "clusterCIDR is empty (--cluster-cidr): with detectLocalMode ClusterCIDR kp cannot tell pods from other clients, " +
			"so traffic to ClusterIPs from outside the cluster is not masqueraded; set the cluster's pod CIDR(s), or another detectLocalMode", nil
	}
	return "", nil
}
