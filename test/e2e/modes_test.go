package e2e

// The modes the suite proves every Service feature for. A test body is
// mode-agnostic: forEachMode runs it once per mode, each in its own world,
// and what differs between modes (kp's flags, how to read its rules, where
// the kernel keeps session affinity) sits behind the env methods below.
//
// Single-mode on purpose (nftables only; KP_E2E_MODES without nftables
// skips them), each for its reason:
//   - they prove a source, which feeds every mode the same State: the
//     folder's (TestEditedManifestTakesEffectWithoutRestart,
//     TestBrokenManifestLeavesOtherServicesWorking) and the API server's
//     (TestKubeServicesAndSlicesWrittenThroughClientGoReachTheTraffic,
//     TestKubeStartedWhileAPIServerIsDownWaitsRetriesAndRecovers,
//     TestKubeNodeZoneLabelChangeIsPickedUp,
//     TestKubeKubernetesServiceReachesTheAPIServerFromPods), and the
//     manifests and RBAC tests (kube_manifests_test.go);
//   - they read nftables objects for what they prove of the source:
//     TestKubeAPIServerOutageDropsNoConnectionAndChangesMadeMeanwhileLandAfter
//     (nft handles: nothing rewritten across an outage; serial, 2 minutes)
//     and TestKubeServicesOfAnotherProxyAndHeadlessServicesAreIgnored;
//   - the conntrack sysctl tests (sysctl_test.go): kp sets them at start,
//     before and whatever the mode;
//   - TestKpTopShowsServicesEndpointSharesAndLiveFlowsInATerminal: the TUI
//     reads the status API and conntrack, never a backend, and those are
//     proven per mode (TestStatusAPIReportsSyncsEndpointsAndNewConnections,
//     TestKpFlowsShowsTheConnectionsTheTestMade).

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// mode is one way kp programs the kernel, as the e2e suite runs it.
type mode struct {
	name      string // subtest name and KP_E2E_MODES entry
	proxyMode string // what kp reports: status API, /proxyMode
	// backend is the iptables backend, "nft" or "legacy", of the iptables
	// mode or of the userspace mode's iptables redirects; "" when kp's
	// rules are nftables tables.
	backend string
	args    []string // kp proxy's flags for this mode
	// syncFailures is the mode's own upstream failure counter, which a
	// healthy run keeps at 0.
	syncFailures string
	// nodePortsOnEveryIP: without --nodeport-addresses, NodePorts answer
	// on every IP of the node (upstream's iptables mode), not only on its
	// primary IPs (upstream's nftables mode).
	nodePortsOnEveryIP bool
	// userspace: kp proxies the connections itself (legacy/userspace);
	// its rules are the redirect table kp-userspace, or with a backend
	// its KP-USERSPACE- chains.
	userspace bool
	// ipvs: IPVS virtual servers, kp's ipsets and KP-IPVS- chains (in
	// backend's iptables); the host's kernel has none, the VM runs it
	// (TestIPVSModeInTheVM).
	ipvs bool
}

var (
	modeNFTables = mode{name: "nftables", proxyMode: "nftables",
		args:         []string{"--proxy-mode", "nftables"},
		syncFailures: `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}`}
	modeIPTablesNFT = mode{name: "iptables-nft", proxyMode: "iptables", backend: "nft",
		args:               []string{"--proxy-mode", "iptables", "--iptables-backend", "nft"},
		syncFailures:       `kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"}`,
		nodePortsOnEveryIP: true}
	modeIPTablesLegacy = mode{name: "iptables-legacy", proxyMode: "iptables", backend: "legacy",
		args:               []string{"--proxy-mode", "iptables", "--iptables-backend", "legacy"},
		syncFailures:       `kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"}`,
		nodePortsOnEveryIP: true}

	modeUserspace = mode{name: "userspace", proxyMode: "userspace", userspace: true,
		args:               []string{"--proxy-mode", "userspace", "--userspace-redirect", "nftables"},
		syncFailures:       `kp_userspace_sync_failures_total{ip_family="IPv4"}`,
		nodePortsOnEveryIP: true}
	// modeUserspaceIPTables is the userspace mode with its fallback
	// redirects, iptables REDIRECT rules, in the backend a kernel without
	// nftables has: iptables-legacy.
	modeUserspaceIPTables = mode{name: "userspace-iptables", proxyMode: "userspace", userspace: true, backend: "legacy",
		args:               []string{"--proxy-mode", "userspace", "--userspace-redirect", "iptables", "--iptables-backend", "legacy"},
		syncFailures:       `kp_userspace_sync_failures_total{ip_family="IPv4"}`,
		nodePortsOnEveryIP: true}

	modeIPVS = mode{name: "ipvs", proxyMode: "ipvs", backend: "nft", ipvs: true,
		args:               []string{"--proxy-mode", "ipvs", "--iptables-backend", "nft"},
		syncFailures:       `kp_sync_proxy_rules_failures_total`,
		nodePortsOnEveryIP: true}

	// allModes is every mode that claims the Service features.
	allModes = []mode{modeNFTables, modeIPTablesNFT, modeIPTablesLegacy, modeUserspace, modeUserspaceIPTables, modeIPVS}
)

// iptables reports the iptables mode (upstream's rule layout; the ipvs and
// userspace modes write iptables chains too, but not that layout).
func (m mode) iptables() bool { return m.backend != "" && !m.userspace && !m.ipvs }

// rulesInIPTables reports whether kp's rules are iptables chains (the
// iptables mode's, or the userspace mode's iptables redirects), listed with
// iptables-save. The ipvs mode's are IPVS virtual servers, ipsets and
// chains, listed together (ipvsListing).
func (m mode) rulesInIPTables() bool { return m.backend != "" && !m.ipvs }

// entryChain is the first chain of kp's iptables rules, which every
// listing of them holds.
func (m mode) entryChain() string {
	switch {
	case m.userspace:
		return "KP-USERSPACE-PORTALS"
	case m.ipvs:
		return "KP-IPVS-SERVICES"
	}
	return "KP-SERVICES"
}

// feature is something a test proves that not every mode claims.
type feature string

const (
	featureClientIP       feature = "the client's address reaches the endpoint"
	featureKernelAffinity feature = "ClientIP affinity entries in the kernel"
	featureConntrackNAT   feature = "one conntrack entry from the client to the endpoint"
	featureRestart        feature = "connections survive a kp restart"
	featureSCTP           feature = "SCTP Service ports"
	// featureLocalPolicyInternalReach: with externalTrafficPolicy Local,
	// pods and the node reach every endpoint through the NodePort and
	// external addresses, and outside clients are dropped (not refused)
	// when the node has no local endpoint.
	featureServiceComments          feature = "every Service named in a comment of kp's rules"
	featureStaleUDPByKP             feature = "stale UDP flows are deleted by kp's conntrack cleaner"
	featureLocalPolicyInternalReach feature = "externalTrafficPolicy Local: pods and the node reach every endpoint; no local endpoint drops"
	// featureLargeService: a Service of 5,000 endpoints, beside the bad
	// objects, programmed within the test's wait for kp's first sync.
	featureLargeService feature = "a Service of 5,000 endpoints answers"
)

// unclaimed says, per mode, which features it does not claim and why: the
// one place the suite's per-mode skips come from, and what docs/features.md's
// feature table says in the mode's column.
var unclaimed = map[string]map[feature]string{
	"userspace":          userspaceUnclaimed,
	"userspace-iptables": userspaceUnclaimed,
	"ipvs": {
		featureServiceComments: "IPVS virtual servers and ipset entries carry no names (ipvsadm -Ln lists addresses " +
			"and ports, as with upstream's ipvs mode); the KP-IPVS- chains are static and commented",
		featureStaleUDPByKP: "IPVS ends a flow to a deleted real server itself (net.ipv4.vs.expire_nodest_conn=1: the " +
			"flow's next packet expires the IPVS connection and its conntrack entry) before kp's cleaner sees it; the " +
			"client following its server is proven all the same",
		featureKernelAffinity: "IPVS keeps a persistence template as long as a connection it placed lives (a closed " +
			"TCP connection stays in TIME_WAIT for 2 minutes), not for the Service's timeout after the last packet, so " +
			"the test's kernel-table check does not apply (the behaviour is proven all the same)",
		featureLocalPolicyInternalReach: "as upstream's ipvs mode: a NodePort or external address is one IPVS virtual server " +
			"whose real servers are the node's local endpoints, whoever the client (pods and the node too); with none, " +
			"IPVS answers new connections with ICMP port unreachable (refused, not dropped)",
		featureLargeService: "not proven: in the VM (qemu emulating the CPU) kp's first sync of 5,000 real servers " +
			"and their ipset entries had not finished after the test's 2-minute wait (2026-11-27); the host has no IPVS",
	},
}

// userspaceUnclaimed is what the userspace mode does not claim, however
// it redirects.
var userspaceUnclaimed = map[feature]string{
	featureClientIP: "the proxy opens its own connection to the endpoint, which sees the node's address " +
		"(externalTrafficPolicy Local keeps to local endpoints but cannot keep the source)",
	featureKernelAffinity: "ClientIP affinity is held in kp's memory, not in a kernel table the test could read " +
		"(the behaviour is proven all the same)",
	featureConntrackNAT: "the proxy makes two flows (client to node, node to endpoint); no conntrack entry joins " +
		"the client to the endpoint, so kp flows cannot attribute an endpoint from conntrack",
	featureRestart: "the listeners and the connections live in the kp process: while kp restarts, new " +
		"connections are refused and open ones end",
	featureSCTP: "Go has no SCTP sockets: SCTP Service ports are not proxied",
}

// claims reports whether mode m claims feature f.
func (m mode) claims(f feature) bool {
	_, ok := unclaimed[m.name][f]
	return !ok
}

// skipUnclaimed skips t when mode m does not claim f, with the reason.
func skipUnclaimed(t *testing.T, m mode, f feature) {
	t.Helper()
	if reason, ok := unclaimed[m.name][f]; ok {
		t.Skipf("%s mode does not claim %s: %s", m.name, f, reason)
	}
}

// nftTable is the mode's nftables table (both families): kp's, or the
// userspace mode's redirect table.
func (m mode) nftTable() string {
	if m.userspace {
		return "kp-userspace"
	}
	return "kp"
}

// save is the iptables-save binary of the mode's backend for a family
// ("ip" or "ip6").
func (m mode) save(family string) string {
	if family == "ip6" {
		return "ip6tables-" + m.backend + "-save"
	}
	return "iptables-" + m.backend + "-save"
}

// selectedModes is allModes, or the modes KP_E2E_MODES lists (comma
// separated) for a quick local run, e.g. KP_E2E_MODES=nftables.
func selectedModes(t *testing.T) []mode {
	t.Helper()
	list := os.Getenv("KP_E2E_MODES")
	if list == "" {
		return allModes
	}
	var out []mode
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := indexMode(name)
		if i < 0 {
			t.Fatalf("KP_E2E_MODES: unknown mode %q; modes are %s", name, modeNames())
		}
		out = append(out, allModes[i])
	}
	return out
}

// modeNames lists allModes' names, for an error.
func modeNames() string {
	names := make([]string, len(allModes))
	for i, m := range allModes {
		names[i] = m.name
	}
	return strings.Join(names, ", ")
}

func indexMode(name string) int {
	for i, m := range allModes {
		if m.name == name {
			return i
		}
	}
	return -1
}

// skipUnselected skips a test of mode m when KP_E2E_MODES leaves m out.
func skipUnselected(t *testing.T, m mode) {
	t.Helper()
	for _, s := range selectedModes(t) {
		if s.name == m.name {
			return
		}
	}
	t.Skipf("mode %s not in KP_E2E_MODES=%s", m.name, os.Getenv("KP_E2E_MODES"))
}

// forEachMode runs body once per selected mode, as parallel subtests named
// after the mode; body builds its own world (newEnv, which makes the
// subtest parallel). The test itself runs in parallel with the others.
func forEachMode(t *testing.T, body func(t *testing.T, m mode)) {
	t.Helper()
	t.Parallel()
	runModes(t, body)
}

// forEachModeOf is forEachMode for the selected modes of a kind (the
// iptables mode's two backends): a test of one mode's own rules, which the
// others do not write, runs no subtest for them rather than skipping.
func forEachModeOf(t *testing.T, of func(mode) bool, body func(t *testing.T, m mode)) {
	t.Helper()
	t.Parallel()
	for _, m := range selectedModes(t) {
		if of(m) {
			t.Run(m.name, func(t *testing.T) { body(t, m) })
		}
	}
}

// forEachModeSerial is forEachMode for a body that must not run in
// parallel with anything (it builds its world with newEnvSerial).
func forEachModeSerial(t *testing.T, body func(t *testing.T, m mode)) {
	t.Helper()
	runModes(t, body)
}

func runModes(t *testing.T, body func(t *testing.T, m mode)) {
	t.Helper()
	for _, m := range selectedModes(t) {
		t.Run(m.name, func(t *testing.T) { body(t, m) })
	}
}

// rules lists kp's rules in the node, both families: nftables mode its two
// tables, iptables mode the lines of its backend's iptables-save that name
// a KP- chain (declarations, rules, and the jumps into them), under their
// table headers.
func (e *env) rules() string {
	e.t.Helper()
	out, err := e.listRules()
	if err != nil {
		e.t.Fatalf("list kp's rules (%s): %v", e.mode.name, err)
	}
	return out
}

func (e *env) listRules() (string, error) {
	if e.mode.ipvs {
		return ipvsListing(e.w)
	}
	var b strings.Builder
	for _, family := range []string{"ip", "ip6"} {
		if !e.mode.rulesInIPTables() {
			out, err := e.w.NFT("list", "table", family, e.mode.nftTable())
			if err != nil {
				return b.String(), err
			}
			b.WriteString(out)
			continue
		}
		out, err := e.w.Exec(e.w.Node(), e.mode.save(family))
		if err != nil {
			return b.String(), fmt.Errorf("%s: %v\n%s", e.mode.save(family), err, out)
		}
		b.WriteString(kpChainLines(out))
	}
	return b.String(), nil
}

// kpChainLines keeps the table headers and the lines of an iptables-save
// that mention a KP- chain.
func kpChainLines(save string) string {
	var b strings.Builder
	for _, line := range strings.Split(save, "\n") {
		if strings.HasPrefix(line, "*") || strings.Contains(line, "KP-") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// ruleLine returns the first line of rules that holds every word, or "".
func ruleLine(rules string, words ...string) string {
	for _, line := range strings.Split(rules, "\n") {
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			return line
		}
	}
	return ""
}

// noKPRules reports nil when the node holds nothing of kp in this env's
// mode.
func (e *env) noKPRules() error { return noKPRules(e.w, e.mode) }

// noKPRules reports nil when w's node holds nothing of kp in mode m: no kp
// table (nftables), no KP- chain or jump in either family of m's backend
// (iptables).
func noKPRules(w *netns.World, m mode) error {
	if m.ipvs {
		return noIPVSState(w)
	}
	if !m.rulesInIPTables() {
		out, err := w.NFT("list", "tables")
		if err != nil {
			return err
		}
		if regexp.MustCompile(`(?m)^table ip6? ` + regexp.QuoteMeta(m.nftTable()) + `$`).MatchString(out) {
			return fmt.Errorf("kp's nftables tables are still there:\n%s", out)
		}
		return nil
	}
	for _, family := range []string{"ip", "ip6"} {
		out, err := w.Exec(w.Node(), m.save(family))
		if err != nil {
			return fmt.Errorf("%s: %v\n%s", m.save(family), err, out)
		}
		if strings.Contains(out, "KP-") {
			return fmt.Errorf("%s still holds kp's chains:\n%s", m.save(family), kpChainLines(out))
		}
	}
	return nil
}

// affinityRemembers reports whether the kernel holds an unexpired session
// affinity entry for clientIP, whose Service's timeout is timeout.
//
// nftables mode: kp's affinity sets carry the timeout themselves, so the
// kernel drops expired elements and the client is in the ruleset or not.
// iptables mode (upstream's layout): the recent match keeps one list per
// KP-SEP chain, /proc/net/xt_recent/KP-SEP-…, per network namespace (read in
// the node; the same files for both backends, as iptables-nft runs the
// xtables match). A list entry is not removed when it expires, only when a
// later packet checks it with --reap, so "remembered" means an entry seen
// within the timeout, by its last_seen in jiffies.
func (e *env) affinityRemembers(clientIP string, timeout time.Duration) bool {
	e.t.Helper()
	if e.mode.ipvs {
		return ipvsRemembers(e.w, clientIP)
	}
	if !e.mode.iptables() {
		return strings.Contains(e.rules(), clientIP)
	}
	out, _ := e.w.Exec(e.w.Node(), "sh", "-c", "cat /proc/net/xt_recent/KP-SEP-* 2>/dev/null; true")
	now, hz := jiffies(e.t)
	// "src=10.0.0.5 ttl: 64 last_seen: 4297368273 oldest_pkt: 1 4297368273"
	re := regexp.MustCompile(`(?m)^src=` + regexp.QuoteMeta(clientIP) + ` .*last_seen: (\d+)`)
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		seen, _ := strconv.ParseUint(m[1], 10, 64)
		if now >= seen && time.Duration(float64(now-seen)/hz*float64(time.Second)) < timeout {
			return true
		}
	}
	return false
}

// jiffies reads the kernel's jiffies and estimates HZ from two readings
// 200 ms apart (rounded to a kernel's CONFIG_HZ choices), for xt_recent's
// timestamps. The clock is the machine's, not a namespace's.
func jiffies(t *testing.T) (now uint64, hz float64) {
	t.Helper()
	read := func() uint64 {
		f, err := os.Open("/proc/timer_list")
		if err != nil {
			t.Fatalf("read jiffies: %v", err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "jiffies: "); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				if err == nil {
					return n
				}
			}
		}
		t.Fatalf("read jiffies: no \"jiffies:\" line in /proc/timer_list")
		return 0
	}
	a := read()
	start := time.Now()
	time.Sleep(200 * time.Millisecond)
	b := read()
	measured := float64(b-a) / time.Since(start).Seconds()
	hz = 1000
	for _, c := range []float64{100, 250, 300, 1000} {
		if abs(measured-c) < abs(measured-hz) {
			hz = c
		}
	}
	return b, hz
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}
