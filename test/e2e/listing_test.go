package e2e

import (
	"regexp"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The operator's view of kp's rules: nftables mode through the nft CLI
// (every object decodes; each Service named in a comment), iptables mode
// through its backend's iptables-save (each Service named in a comment;
// every KP- chain a rule jumps to exists; nothing the tool cannot print).
func TestRulesetListsCleanlyWithServiceComments(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		skipUnclaimed(t, m, featureServiceComments)
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		svc := web(pods...)
		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort = 30080
		// Both Services in both families: each family's listing names them.
		svc.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
		e.write("web.yaml", svc,
			Service{Namespace: "other-ns", Name: "empty", ClusterIPs: []string{"10.96.0.20", "fd00:96::20"},
				Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}})
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP)
		if m.rulesInIPTables() {
			e.checkIPTablesListing(t)
		} else {
			e.checkNFTListing(t)
		}
	})
}

func (e *env) checkNFTListing(t *testing.T) {
	t.Helper()
	out, err := e.w.NFT("list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset in the node: %v\n%s", err, out)
	}
	for _, want := range []string{"table ip kp", "table ip6 kp"} {
		if !strings.Contains(out, want) {
			t.Errorf("ruleset lacks %q", want)
		}
	}
	// Each Service is named, namespace/name, in a comment (perhaps followed
	// by ":port").
	for _, svc := range []string{"e2e/web", "other-ns/empty"} {
		if !regexp.MustCompile(`comment "` + regexp.QuoteMeta(svc) + `[":]`).MatchString(out) {
			t.Errorf("no comment names Service %s", svc)
		}
	}
	// What nft cannot decode it prints as "unknown" or "[invalid …]".
	for _, bad := range []string{"unknown", "[invalid", "# unsupported"} {
		if strings.Contains(out, bad) {
			t.Errorf("ruleset holds %q", bad)
		}
	}
	if t.Failed() {
		t.Logf("nft list ruleset:\n%s", out)
	}
}

func (e *env) checkIPTablesListing(t *testing.T) {
	t.Helper()
	for _, family := range []string{"ip", "ip6"} {
		save := e.mode.save(family)
		out, err := e.w.Exec(e.w.Node(), save)
		if err != nil {
			t.Fatalf("%s in the node: %v\n%s", save, err, out)
		}
		if !strings.Contains(out, ":"+e.mode.entryChain()) {
			t.Errorf("%s: no %s chain", save, e.mode.entryChain())
		}
		// Each Service is named, namespace/name, in a comment (perhaps
		// followed by ":port"); iptables-save quotes a comment with spaces.
		for _, svc := range []string{"e2e/web", "other-ns/empty"} {
			if !regexp.MustCompile(`--comment "?` + regexp.QuoteMeta(svc) + `[":\s]`).MatchString(out) {
				t.Errorf("%s: no comment names Service %s", save, svc)
			}
		}
		// Every KP- chain a rule jumps or goes to is declared in its
		// table; iptables-restore would refuse the listing otherwise.
		declared := map[string]bool{}
		table := ""
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "*") {
				table = line[1:]
			}
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], ":KP-") {
				declared[table+" "+f[0][1:]] = true
			}
		}
		jump := regexp.MustCompile(`-[jg] (KP-\S+)`)
		table = ""
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "*") {
				table = line[1:]
			}
			for _, m := range jump.FindAllStringSubmatch(line, -1) {
				if !declared[table+" "+m[1]] {
					t.Errorf("%s: table %s jumps to undeclared chain %s: %s", save, table, m[1], line)
				}
			}
		}
		// What the tool cannot print it marks so (iptables-nft on a rule
		// it cannot translate back).
		for _, bad := range []string{"unsupported", "incompatible", "[unknown"} {
			if strings.Contains(out, bad) {
				t.Errorf("%s holds %q", save, bad)
			}
		}
		if t.Failed() {
			t.Logf("%s:\n%s", save, out)
		}
	}
}
