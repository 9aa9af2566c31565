package nodes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/cmd/kp/fromkubeproxy"
	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/test/cluster"
)

// kpMigrateStdout runs kp migrate cluster and returns its standard output
// alone (JSON, a ConfigMap); the standard error is logged.
func kpMigrateStdout(t *testing.T, c *cluster.Cluster, kpBin string, args ...string) (string, error) {
	t.Helper()
	kubeconfig := c.API.Kubeconfig(0, c.API.AdminToken())
	argv := append([]string{"netns", "exec", c.API.NS(), kpBin, "migrate", "cluster", "--kubeconfig", kubeconfig}, args...)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("ip", argv...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("kp migrate cluster %s: %v; stderr:\n%s", strings.Join(args, " "), errOrOK(err), stderr.String())
	return stdout.String(), err
}

// preflightJSON runs the preflight (-o json) and decodes it.
func preflightJSON(t *testing.T, c *cluster.Cluster, kpBin string) *fromkubeproxy.Report {
	t.Helper()
	out, err := kpMigrateStdout(t, c, kpBin, "--from-kube-proxy", "--dry-run", "-o", "json")
	if err != nil {
		t.Fatalf("--dry-run -o json: %v\n%s", err, out)
	}
	var r fromkubeproxy.Report
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("--dry-run -o json is not the report: %v\n%s", err, out)
	}
	if len(r.Nodes) != len(c.Nodes) {
		t.Fatalf("the preflight names %d nodes, the cluster has %d:\n%s", len(r.Nodes), len(c.Nodes), out)
	}
	return &r
}

// severities is each node's items' severities, "node/item": severity.
func severities(r *fromkubeproxy.Report) map[string]fromkubeproxy.Severity {
	out := map[string]fromkubeproxy.Severity{}
	for _, it := range r.Cluster {
		out[it.ID] = it.Severity
	}
	for _, n := range r.Nodes {
		for _, it := range n.Items {
			out[n.Node+"/"+it.ID] = it.Severity
		}
	}
	return out
}

// checkPreflight runs kp migrate cluster --from-kube-proxy --dry-run (as
// text and -o json) and --print-config against the cluster's kube-proxy
// (iptables mode, kubeadm's ConfigMap, no kp yet): the preflight covers
// both nodes, warns of the localhost NodePorts and NodePort addresses the
// nftables mode drops, finds clusterCIDR and conntrack carried over; the
// printed ConfigMap carries kube-proxy's clusterCIDR, conntrack and API
// server, read back by kp's decoder. It returns the printed ConfigMap.
func checkPreflight(t *testing.T, c *cluster.Cluster, kpBin string) string {
	t.Helper()
	out, err := kpMigrate(t, c, kpBin, "--from-kube-proxy", "--dry-run")
	if err != nil {
		t.Fatalf("--dry-run: %v", err)
	}
	want := []string{"kube-proxy: iptables mode, from ConfigMap kube-system/kube-proxy, key config.conf", "Preflight: 0 error(s)"}
	for _, n := range c.Nodes {
		want = append(want, fmt.Sprintf("Node %s (InternalIP %s", n.Name, n.IP))
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("the preflight's text has no %q", w)
		}
	}
	r := preflightJSON(t, c, kpBin)
	got := severities(r)
	for _, n := range c.Nodes {
		for item, want := range map[string]fromkubeproxy.Severity{"localhost-nodeports": fromkubeproxy.SeverityWarning,
			"nodeport-addresses": fromkubeproxy.SeverityWarning, "cluster-cidr": fromkubeproxy.SeverityOK, "conntrack": fromkubeproxy.SeverityOK} {
			if got[n.Name+"/"+item] != want {
				t.Errorf("%s: %s is %q, want %q", n.Name, item, got[n.Name+"/"+item], want)
			}
		}
	}
	if !r.KP.Generated || got["api-server"] != fromkubeproxy.SeverityOK {
		t.Errorf("kp's side %+v, api-server %q: want the generated configuration, reaching kube-proxy's API server", r.KP, got["api-server"])
	}

	printed, err := kpMigrateStdout(t, c, kpBin, "--from-kube-proxy", "--print-config")
	if err != nil {
		t.Fatalf("--print-config: %v\n%s", err, printed)
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(printed), &cm); err != nil {
		t.Fatalf("--print-config's ConfigMap: %v\n%s", err, printed)
	}
	kc, lenient, err := options.DecodeKubeProxyConfiguration([]byte(cm.Data["config.conf"]), "--print-config's config.conf")
	if len(lenient) > 0 {
		t.Errorf("the printed configuration decodes only leniently: %v", lenient)
	}
	if err != nil {
		t.Fatal(err)
	}
	kcfg, err := clientcmd.Load([]byte(cm.Data["kubeconfig.conf"]))
	if err != nil {
		t.Fatalf("--print-config's kubeconfig.conf: %v", err)
	}
	server := kcfg.Clusters[kcfg.Contexts[kcfg.CurrentContext].Cluster].Server
	if kc.ClusterCIDR != c.ClusterCIDR.String() || kc.Conntrack.MaxPerCore == nil || *kc.Conntrack.MaxPerCore != 0 || kc.Mode != "nftables" ||
		server != "https://"+c.API.Instance(0).Addr.String() {
		t.Errorf("--print-config: mode %q clusterCIDR %q (want %s), conntrack.maxPerCore %v (want 0), server %q:\n%s",
			kc.Mode, kc.ClusterCIDR, c.ClusterCIDR, kc.Conntrack.MaxPerCore, server, printed)
	}
	return printed
}

// checkPreflightWithKPsConfigMap runs the preflight once kp's ConfigMap
// exists (the one --print-config wrote): it is kp's side now, and nothing
// in it is off.
func checkPreflightWithKPsConfigMap(t *testing.T, c *cluster.Cluster, kpBin string) {
	t.Helper()
	r := preflightJSON(t, c, kpBin)
	got := severities(r)
	if r.KP.Generated || r.KP.Config != "ConfigMap kube-system/kp, key config.conf" || r.Summary.Error != 0 {
		t.Errorf("kp's side %+v, summary %+v: want kp's ConfigMap, no error", r.KP, r.Summary)
	}
	for _, item := range []string{"api-server", "config", "masquerade-all"} {
		if got[item] != fromkubeproxy.SeverityOK {
			t.Errorf("%s is %q with kp's ConfigMap from --print-config, want ok", item, got[item])
		}
	}
	for _, n := range c.Nodes {
		for _, item := range []string{"cluster-cidr", "conntrack"} {
			if got[n.Name+"/"+item] != fromkubeproxy.SeverityOK {
				t.Errorf("%s: %s is %q with kp's ConfigMap from --print-config, want ok", n.Name, item, got[n.Name+"/"+item])
			}
		}
	}
}
