package fromkubeproxy

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Severity grades an item.
type Severity string

const (
	// SeverityOK: kp behaves as kube-proxy did.
	SeverityOK Severity = "ok"
	// SeverityInfo: kp differs in nothing that works today (or does more).
	SeverityInfo Severity = "info"
	// SeverityWarning: something that works with kube-proxy will behave
	// differently with kp.
	SeverityWarning Severity = "warning"
	// SeverityError: kp would not start, or not reach the API server, as
	// configured.
	SeverityError Severity = "error"
)

// Item is one thing the preflight compares. Its JSON field names are kept
// stable for scripts (kp migrate cluster --dry-run -o json).
type Item struct {
	// ID names the item: mode, config, api-server, masquerade-all,
	// ipvs-scheduler, strict-arp, detect-local-mode (every node);
	// localhost-nodeports, nodeport-addresses, cluster-cidr, conntrack
	// (per node).
	ID       string   `json:"id"`
	Severity Severity `json:"severity"`
	// KubeProxy is what kube-proxy does, KP what kp in the target mode
	// will do.
	KubeProxy string `json:"kubeProxy"`
	KP        string `json:"kp"`
	// Action is what to do about it, when there is something to do.
	Action string `json:"action,omitempty"`
}

// Side is one proxy's mode and the configuration it was read from.
type Side struct {
	Mode string `json:"mode"`
	// ModeFrom (kp only) says where the target mode comes from: --to,
	// kp's ConfigMap, or kp's default.
	ModeFrom string `json:"modeFrom,omitempty"`
	Config   string `json:"config"`
	// Generated (kp only): kp's ConfigMap does not exist yet, and the
	// report describes the one --print-config writes.
	Generated bool `json:"generated,omitempty"`
}

// NodeReport is one node's facts, as the API server has them, and its
// items.
type NodeReport struct {
	Node string `json:"node"`
	// Addresses are the Node's status addresses ("InternalIP 10.0.0.1").
	Addresses []string `json:"addresses"`
	PodCIDRs  []string `json:"podCIDRs"`
	// CPUs is the Node's CPU capacity (0: not reported).
	CPUs  int64  `json:"cpus"`
	Items []Item `json:"items"`
}

// Summary counts the items of each severity, every node's included.
type Summary struct {
	OK      int `json:"ok"`
	Info    int `json:"info"`
	Warning int `json:"warning"`
	Error   int `json:"error"`
}

// Report is the preflight of a migration from kube-proxy to kp: the items
// that are the same on every node (Cluster), then each node's.
type Report struct {
	KubeProxy Side         `json:"kubeProxy"`
	KP        Side         `json:"kp"`
	Cluster   []Item       `json:"cluster"`
	Nodes     []NodeReport `json:"nodes"`
	Summary   Summary      `json:"summary"`
}

func (r *Report) count() {
	r.Summary = Summary{}
	add := func(items []Item) {
		for _, it := range items {
			switch it.Severity {
			case SeverityOK:
				r.Summary.OK++
			case SeverityInfo:
				r.Summary.Info++
			case SeverityWarning:
				r.Summary.Warning++
			case SeverityError:
				r.Summary.Error++
			}
		}
	}
	add(r.Cluster)
	for _, n := range r.Nodes {
		add(n.Items)
	}
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a person: each item's severity and id,
// then what kube-proxy does, what kp will do, and what to do.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "Preflight: what changes when kp serves in place of kube-proxy\n")
	fmt.Fprintf(w, "  kube-proxy: %s mode, from %s\n", r.KubeProxy.Mode, r.KubeProxy.Config)
	fmt.Fprintf(w, "  kp:         %s mode (%s), from %s\n", r.KP.Mode, r.KP.ModeFrom, r.KP.Config)
	fmt.Fprintf(w, "Every node:\n")
	writeItems(w, r.Cluster)
	for _, n := range r.Nodes {
		cpus := "CPUs unknown"
		if n.CPUs > 0 {
			cpus = fmt.Sprintf("%d CPUs", n.CPUs)
		}
		fmt.Fprintf(w, "Node %s (%s; podCIDRs %s; %s):\n", n.Node, orNone(strings.Join(n.Addresses, ", ")),
			orNone(strings.Join(n.PodCIDRs, ", ")), cpus)
		writeItems(w, n.Items)
	}
	s := r.Summary
	fmt.Fprintf(w, "Preflight: %d error(s), %d warning(s), %d info, %d ok\n", s.Error, s.Warning, s.Info, s.OK)
}

func writeItems(w io.Writer, items []Item) {
	for _, it := range items {
		fmt.Fprintf(w, "  %-8s %s\n", strings.ToUpper(string(it.Severity)), it.ID)
		fmt.Fprintf(w, "           kube-proxy: %s\n", it.KubeProxy)
		fmt.Fprintf(w, "           kp:         %s\n", it.KP)
		if it.Action != "" {
			fmt.Fprintf(w, "           do:         %s\n", it.Action)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
