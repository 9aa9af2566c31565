package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// What of kp's and kube-proxy's the node holds, backend by backend, and
// the check that only the running mode's is there (after a switch, a
// take-over, a restart).

// Keys of rulesOf's listing besides the iptables-save binaries.
const (
	listNFTables = "nftables" // tables: "ip kp", "ip6 kp-userspace", "ip kube-proxy"
	listIPVS     = "ipvs"     // virtual servers: "TCP 10.96.0.10:80"
	listIPSets   = "ipsets"   // KP- and KUBE- ipsets
	listLinks    = "links"    // kp-ipvs0, kube-ipvs0
)

// saves are the iptables-save binaries, each flavor and family.
var saves = []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"}

// rulesOf lists, per backend, what of kp's and kube-proxy's is in the node
// namespace: the nftables tables kp, kp-userspace and kube-proxy, the
// KP-/KUBE- chains in each iptables flavor and family (kubelet's own KUBE-
// chains are not kube-proxy's and are left out), and on a kernel with IPVS
// the virtual servers, the KP-/KUBE- ipsets and the ipvs modes' dummy
// links. One shell runs every listing: each exec into the namespace costs
// seconds in the VM.
func (e *env) rulesOf() map[string][]string {
	e.t.Helper()
	cmds := append([]string{"nft list tables"}, saves...)
	_, ipvsErr := os.Stat("/proc/net/ip_vs")
	if ipvsErr == nil {
		cmds = append(cmds, "ipvsadm -Ln", "ipset list -n", "ip -o link show")
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, c := range cmds {
		fmt.Fprintf(&script, "echo '### %s'\n%s\n", c, c)
	}
	all, err := e.w.Exec(e.w.Node(), "sh", "-c", script.String())
	if err != nil {
		e.t.Fatalf("list the node's rules: %v\n%s", err, all)
	}
	out := map[string][]string{}
	for _, part := range strings.Split(all, "### ")[1:] {
		cmd, text, _ := strings.Cut(part, "\n")
		for _, l := range strings.Split(text, "\n") {
			f := strings.Fields(l)
			switch bin, _, _ := strings.Cut(cmd, " "); {
			case bin == "nft":
				if len(f) == 3 && f[0] == "table" && slices.Contains([]string{"kp", "kp-userspace", "kube-proxy"}, f[2]) {
					out[listNFTables] = append(out[listNFTables], f[1]+" "+f[2])
				}
			case slices.Contains(saves, bin):
				if strings.HasPrefix(l, ":KP-") || (strings.HasPrefix(l, ":KUBE-") && !kubeletChain(l)) {
					name, _, _ := strings.Cut(l[1:], " ")
					out[bin] = append(out[bin], name)
				}
			case bin == "ipvsadm":
				if len(f) >= 2 && slices.Contains([]string{"TCP", "UDP", "SCTP"}, f[0]) {
					out[listIPVS] = append(out[listIPVS], f[0]+" "+f[1])
				}
			case bin == "ipset":
				if len(f) == 1 && (strings.HasPrefix(f[0], "KP-") || strings.HasPrefix(f[0], "KUBE-")) {
					out[listIPSets] = append(out[listIPSets], f[0])
				}
			case bin == "ip":
				// "7: kp-ipvs0: <BROADCAST,NOARP> ..."
				if len(f) >= 2 && slices.Contains([]string{"kp-ipvs0:", "kube-ipvs0:"}, f[1]) {
					out[listLinks] = append(out[listLinks], strings.TrimSuffix(f[1], ":"))
				}
			}
		}
	}
	return out
}

func kubeletChain(l string) bool {
	for _, c := range []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"} {
		if strings.HasPrefix(l, ":"+c+" ") {
			return true
		}
	}
	return false
}

// expectOnly checks that the node has the rules of kp's target mode, in
// both families, and nobody else's, backend by backend: nftables tables,
// both iptables flavors and families, and where IPVS is, virtual servers,
// ipsets and the dummy link. The ipvs mode's chains are in one iptables
// flavor, whichever it chose (the one its flags name, or the one already
// holding rules).
func (e *env) expectOnly(target string) {
	e.t.Helper()
	got := e.rulesOf()
	_, ipvsErr := os.Stat("/proc/net/ip_vs")
	ipvsKernel := ipvsErr == nil
	// want is the target's part of each listing: exactly the entries in
	// exact, or entries that match (at least one unless optional); a
	// listing without a part must be empty.
	type part struct {
		exact    []string
		match    func(string) bool
		optional bool
	}
	want := map[string]part{}
	// The iptables mode's chains, and the ipvs mode's (a prefix the
	// iptables mode neither writes nor removes); the userspace mode's
	// iptables redirects (KP-USERSPACE-) are neither.
	iptablesChains := part{match: func(x string) bool {
		return strings.HasPrefix(x, "KP-") && !strings.HasPrefix(x, "KP-IPVS-") && !strings.HasPrefix(x, "KP-USERSPACE-")
	}}
	ipvsChains := func(x string) bool { return strings.HasPrefix(x, "KP-IPVS-") }
	switch target {
	case "nftables":
		want[listNFTables] = part{exact: []string{"ip kp", "ip6 kp"}}
	case "userspace":
		want[listNFTables] = part{exact: []string{"ip kp-userspace", "ip6 kp-userspace"}}
	case "iptables-nft", "iptables-legacy":
		flavor := strings.TrimPrefix(target, "iptables-")
		want["iptables-"+flavor+"-save"], want["ip6tables-"+flavor+"-save"] = iptablesChains, iptablesChains
	case "ipvs":
		flavor := "nft"
		if slices.ContainsFunc(got["iptables-legacy-save"], ipvsChains) {
			flavor = "legacy"
		}
		want["iptables-"+flavor+"-save"] = part{match: ipvsChains}
		want["ip6tables-"+flavor+"-save"] = part{match: ipvsChains, optional: true}
		want[listIPVS] = part{match: func(string) bool { return true }}
		want[listIPSets] = part{match: func(x string) bool { return strings.HasPrefix(x, "KP-") }}
		want[listLinks] = part{exact: []string{"kp-ipvs0"}}
	default:
		e.t.Fatalf("expectOnly: unknown mode %q", target)
	}
	if target == "ipvs" && !ipvsKernel {
		e.t.Fatalf("expectOnly(ipvs) on a kernel without IPVS")
	}
	for _, list := range append([]string{listNFTables, listIPVS, listIPSets, listLinks}, saves...) {
		w, entries := want[list], got[list]
		var mine, others []string
		for _, x := range entries {
			if slices.Contains(w.exact, x) || w.match != nil && w.match(x) {
				mine = append(mine, x)
			} else {
				others = append(others, x)
			}
		}
		if len(others) > 0 {
			e.t.Errorf("kp runs %s, but %s lists %v", target, list, others)
		}
		for _, x := range w.exact {
			if !slices.Contains(mine, x) {
				e.t.Errorf("kp runs %s, but %s lacks its %s", target, list, x)
			}
		}
		if w.match != nil && !w.optional && len(mine) == 0 {
			e.t.Errorf("kp runs %s, but %s lists none of its rules", target, list)
		}
	}
	if e.t.Failed() {
		e.t.Logf("rules on the node: %v", fmt.Sprint(got))
	}
}
