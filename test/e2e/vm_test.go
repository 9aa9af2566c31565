package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/vm"
)

// vmServiceTests are the suite's Service-feature tests, run in the VM for
// the ipvs mode (the kube, manifests, TUI and sysctl tests are about
// sources and the process, proven on the host, and the API server would
// take minutes to start under software emulation).
var vmServiceTests = []string{
	"TestClusterIPSpreadsEvenlyOverEveryEndpointAndOnlyThem",
	"TestNodePortAnswersFromOffNodeClient",
	"TestServiceWithoutEndpointsIsRefusedAtOnce",
	"TestRemovedEndpointIsNeverReachedByNewConnections",
	"TestDeletedServiceNoLongerAnswers",
	"TestDualStackClusterIPAnswersOverIPv6",
	"TestRestartLosesNoConnections",
	"TestSessionAffinityClientIPKeepsEachClientOnOneEndpoint",
	"TestExplainNamesTheEndpointAnAffinityEntryPinsTheClientTo",
	"TestExternalTrafficPolicyLocalKeepsTheClientIPAndUsesOnlyLocalEndpoints",
	"TestExternalTrafficPolicyClusterMasqueradesOutsideClients",
	"TestInternalTrafficPolicyLocalUsesOnlyThisNodesEndpoints",
	"TestTerminatingEndpointsServeOnlyWhenNoneIsReady",
	"TestTopologyHintsKeepTrafficInTheNodesZone",
	"TestTopologyNodeHintsAndPreferSameNodeKeepTrafficOnTheNode",
	"TestNamedTargetPortsReachEachPodOnItsOwnNumber",
	"TestLoadBalancerAndExternalIPsWithSourceRanges",
	"TestClusterIPRejectsOtherPortsAndUnallocatedServiceAddressesAreDropped",
	"TestIPv6OnlyServiceAnswersOnItsClusterIPAndNodePort",
	"TestNodePortAnswersOnlyOnTheNodePortAddresses",
	"TestServiceChangesOnALiveNodeLeaveNoStaleRules",
	"TestCleanupRemovesEveryKPRuleAndNothingElse",
	"TestUDPClientFollowsItsServerPodWhenThePodIsReplaced",
	"TestUDPClientFollowsARollingReplacement",
	"TestUDPClientThatStartedBeforeTheFirstEndpointGetsAnswers",
	"TestTCPClientThatTriedBeforeTheServiceConnectsFromTheSamePort",
	"TestTCPConnectionsAreNotTouchedByConntrackCleanup",
	"TestStatusAPIReportsSyncsEndpointsAndNewConnections",
	"TestKpFlowsShowsTheConnectionsTheTestMade",
	"TestHealthCheckNodePortReportsLocalEndpoints",
	"TestMetricsEndpointHasUpstreamMetricsWithSensibleValues",
	"TestBadObjectsAreLoggedAndSkippedWhileTheRestWorks",
	"TestNodesOwnConnectionsToALocalClusterIPAreAnswered",
	"TestRulesChangedByAnotherProcessAreRepairedWithinASecond",
	"TestExplainedRulePathIsTheKernelsTrace",
}

// vmCITests are the ones a plain run (CI's) takes from vmServiceTests:
// under software emulation each world takes 1.5–3 minutes, the whole list
// 8 minutes per kernel mode on a quiet machine (ipvs's took 45 on a loaded
// one). KP_VM_E2E=all runs the whole list.
var vmCITests = []string{
	"TestClusterIPSpreadsEvenlyOverEveryEndpointAndOnlyThem",
	"TestExternalTrafficPolicyLocalKeepsTheClientIPAndUsesOnlyLocalEndpoints",
	"TestLoadBalancerAndExternalIPsWithSourceRanges",
	"TestCleanupRemovesEveryKPRuleAndNothingElse",
}

// vmIPVSTests run in the ipvs boot besides vmCITests (or the whole list):
// the ipvs column of what the host proves for its kernel modes only, one
// world each. TestDaemonSetsContainersAsShippedServeWithNoSysctlWarning:
// the DaemonSet's two containers, as shipped, in ipvs mode.
// TestRulesChangedByAnotherProcessAreRepairedWithinASecond: drift repair,
// whose check differs per mode (IPVS's is its own), while the kernel
// modes' column of the VM's platform matrix takes it from
// vmServiceTests (KP_VM_E2E=all).
// TestExplainedRulePathIsTheKernelsTrace: kp explain's rule path of the
// ipvs mode against the kernel's trace and IPVS's connections.
var vmIPVSTests = []string{
	"TestDaemonSetsContainersAsShippedServeWithNoSysctlWarning",
	"TestRulesChangedByAnotherProcessAreRepairedWithinASecond",
	"TestExplainedRulePathIsTheKernelsTrace",
}

// vmMigrationTests are the migration tests whose ipvs rows run in the VM:
// every ordered pair of kp's modes with ipvs (the matrix's ipvsTours;
// KP_VM_E2E=all adds its hostTours, on the 6.1 kernel), upstream
// kube-proxy's ipvs mode → kp nftables (onlyWithIPVSInTheVM), and the
// kernel fact that migration's long-lived connection depends on (KF-10).
var vmMigrationTests = []string{
	"TestMigrateNodeEveryOrderedPairOfModesDropsNothing",
	"TestMigrateNodeFromUpstreamKubeProxyDropsNothing",
	"TestKernelIPVSConnectionStartedWhileConntrackIsOffIsResetWhenAMasqueradeComesIn",
}

// vmMigrationModes are the modes the migrations in the VM switch between.
const vmMigrationModes = "ipvs,nftables,iptables-nft,iptables-legacy,userspace"

// TestIPVSModeInTheVM boots the 6.1 kernel (test/vm) and runs the suite's
// Service-feature tests there with KP_E2E_MODES=ipvs: the ipvs column of
// the feature table (docs/features.md).
func TestIPVSModeInTheVM(t *testing.T) {
	skipUnselected(t, modeIPVS)
	t.Parallel() // the VM's CPU is mostly the host's second core
	runModesInVM(t, "ipvs", append(slices.Clone(vmTests(vmCITests, vmServiceTests)), vmIPVSTests...), inVMTimeout())
}

// TestIPVSMigrationsInTheVM runs, on the VM's kernel, the switches of kp
// between its ipvs mode and every other mode, both ways, and the migration
// from upstream kube-proxy's ipvs mode to kp's nftables mode.
func TestIPVSMigrationsInTheVM(t *testing.T) {
	for _, m := range strings.Split(vmMigrationModes, ",") {
		skipUnselected(t, allModes[indexMode(m)])
	}
	t.Parallel()
	runModesInVM(t, vmMigrationModes, vmMigrationTests, migrationsInVMTimeout())
}

// vmTests is ci, or all with KP_VM_E2E=all.
func vmTests(ci, all []string) []string {
	if os.Getenv("KP_VM_E2E") == "all" {
		return all
	}
	return ci
}

// TestPlatformMatrixInTheVM runs the kernel modes' columns (nftables,
// iptables-nft, iptables-legacy; those KP_E2E_MODES selects) on the VM's
// 6.1 kernel too, in one boot: the second kernel of the platform matrix
// (the host runs them on its own). KP_VM_MATRIX=0 leaves it out.
func TestPlatformMatrixInTheVM(t *testing.T) {
	if os.Getenv("KP_VM_MATRIX") == "0" {
		t.Skip("KP_VM_MATRIX=0")
	}
	var modes []string
	for _, m := range selectedModes(t) {
		if slices.Contains([]string{modeNFTables.name, modeIPTablesNFT.name, modeIPTablesLegacy.name}, m.name) {
			modes = append(modes, m.name)
		}
	}
	if len(modes) == 0 {
		t.Skipf("none of the kernel modes in KP_E2E_MODES=%s", os.Getenv("KP_E2E_MODES"))
	}
	t.Parallel()
	runModesInVM(t, strings.Join(modes, ","), vmTests(vmCITests, vmServiceTests), inVMTimeout())
}

// inVMTimeout bounds a boot's tests inside the VM: a hung test fails there,
// printing every goroutine's stack, well before the host's package timeout
// (make test's 45 minutes, shared by three boots one after another and the
// host's tests) would kill the VM with nothing to show. make test's lists
// take 3–9 minutes in the VM; KP_VM_E2E=all's 8–19 on a quiet machine (two
// kernel modes in one boot: 19), up to 45 on a loaded one.
func inVMTimeout() time.Duration {
	if os.Getenv("KP_VM_E2E") == "all" {
		return 75 * time.Minute
	}
	return 20 * time.Minute
}

// migrationsInVMTimeout bounds TestIPVSMigrationsInTheVM's boot: the
// matrix's two ipvs tours switch kp four times each (a switch into or out
// of ipvs took 3-5 minutes under emulation on a loaded machine), and the
// kube-proxy migration runs alone (vmAlone). The boot took 29.5 minutes
// at load 10-22 with the two side by side (2026-11-27).
func migrationsInVMTimeout() time.Duration {
	if os.Getenv("KP_VM_E2E") == "all" {
		return 75 * time.Minute
	}
	return 40 * time.Minute
}

// vmAPIServer keeps a world that starts an API server inside the VM (the
// kube-proxy ipvs migration) from sharing the VM's two emulated CPUs with
// the migration matrix's worlds: beside two of them its kube-proxy had not
// synced after a minute, in both VM runs of 2026-11-27. Inside the VM an
// API server's world takes it alone (vmAlone), the others share it
// (vmShare); on the host they do nothing.
var vmAPIServer sync.RWMutex

func vmAlone(t *testing.T) {
	if os.Getenv("KP_VM") == "1" {
		vmAPIServer.Lock()
		t.Cleanup(vmAPIServer.Unlock)
	}
}

func vmShare(t *testing.T) {
	if os.Getenv("KP_VM") == "1" {
		vmAPIServer.RLock()
		t.Cleanup(vmAPIServer.RUnlock)
	}
}

// vmSlot lets one VM run at a time: each emulates its CPUs in software,
// and on CI's two cores three at once, beside the host's tests, starved
// each other past their tests' timeouts.
var vmSlot = make(chan struct{}, 1)

// runModesInVM runs tests (or the pattern KP_VM_E2E_RUN) with
// KP_E2E_MODES=modes in one boot, bounded by timeout inside the VM. kp and the echo server are built here and
// run there (KP_TEST_BINDIR).
func runModesInVM(t *testing.T, modes string, tests []string, timeout time.Duration) {
	if os.Getenv("KP_VM") == "1" {
		t.Skip("already in the VM")
	}
	vm.Require(t)
	// The binaries go to a folder of this test's: the guest's tests sweep
	// netns.Build's folders as stale (their pid is the host's).
	binDir := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"./cmd/kp", "./test/echo"} {
		p, err := netns.Build(pkg)
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err == nil {
			err = os.WriteFile(filepath.Join(binDir, filepath.Base(p)), data, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	pattern := "^(" + strings.Join(tests, "|") + ")$"
	if p := os.Getenv("KP_VM_E2E_RUN"); p != "" {
		pattern = p
	}
	bin := vm.BuildTest(t, "./test/e2e")
	wd, _ := os.Getwd()
	wait := time.Now()
	vmSlot <- struct{}{}
	defer func() { <-vmSlot }()
	t.Logf("waited %v for the VM before this one to end", time.Since(wait).Round(time.Second))
	start := time.Now()
	env := []string{"KP_E2E_MODES=" + modes, netns.BinDirEnv + "=" + binDir}
	if all := os.Getenv("KP_VM_E2E"); all != "" {
		env = append(env, "KP_VM_E2E="+all) // the migration matrix's tours without ipvs too
	}
	out, err := vm.Run(t, vm.Options{Timeout: timeout + 2*time.Minute, MemoryMiB: 3072, Dir: wd, Env: env},
		bin, "-test.v", "-test.count=1", "-test.timeout="+timeout.String(), "-test.run", pattern)
	t.Logf("the %s column in the VM: %v", modes, time.Since(start).Round(time.Second))
	if err != nil {
		t.Errorf("the e2e suite in %s mode in the VM: %v", modes, err)
	}
	results, perr := vm.ParseResults(out)
	if perr != nil {
		t.Errorf("the VM's output: %v", perr)
	}
	t.Logf("in the VM: %s", results.Summary())
	for _, e := range vmClaim(strings.Split(modes, ","), tests, os.Getenv("KP_VM_E2E_RUN") != "").Check(results) {
		t.Errorf("in the VM: %v", e)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("the VM's output:\n%s", out)
	}
}

// vmClaim is what a VM run of tests in modes must show. Each test ran,
// and each (test, mode) pair passed by name — a Service test's subtest
// TestX/<mode>, a migration's subtest from or to the mode
// (TestX/TOUR/ipvs-to-nftables, TestX/kube-proxy-ipvs-to-nftables) — or was
// skipped with the reason the unclaimed table (the feature table's column, docs/features.md) gives
// for that mode. Any other skip needs a reason from vmSkipReasons. With
// KP_VM_E2E_RUN (a pattern of one's own) only the skips and failures are
// checked: which tests it selects is unknown here.
func vmClaim(modes, tests []string, ownPattern bool) vm.Claim {
	c := vm.Claim{SkipReasons: func(test string) []string {
		top, sub, _ := strings.Cut(test, "/")
		reasons := slices.Clone(vmSkipReasons[top])
		if m, _, _ := strings.Cut(sub, "/"); slices.Contains(modes, m) {
			for _, r := range unclaimed[m] {
				reasons = append(reasons, r)
			}
		}
		return reasons
	}}
	if ownPattern {
		return c
	}
	for _, test := range tests {
		c.Pass = append(c.Pass, test)
		if subs, ok := vmMigrationSubtests()[test]; ok {
			for _, sub := range subs {
				c.Pass = append(c.Pass, test+"/"+sub)
			}
			continue
		}
		for _, m := range modes {
			c.Pass = append(c.Pass, test+"/"+m)
		}
	}
	return c
}

// vmMigrationSubtests are the migration tests' subtests the VM proves:
// the matrix's tours with ipvs (and the host's, with KP_VM_E2E=all) and
// each
// of their steps, by name; kube-proxy's ipvs mode (onlyWithIPVSInTheVM);
// KF-10's kernel test, both ways.
func vmMigrationSubtests() map[string][]string {
	var tours []string
	for _, tr := range append(slices.Clone(ipvsTours), hostTours...) {
		if !tr.ipvs() && os.Getenv("KP_VM_E2E") != "all" {
			continue
		}
		tours = append(tours, tr.name)
		for _, h := range tr.hops() {
			tours = append(tours, tr.name+"/"+h)
		}
	}
	return map[string][]string{
		"TestMigrateNodeEveryOrderedPairOfModesDropsNothing": tours,
		"TestMigrateNodeFromUpstreamKubeProxyDropsNothing":   {"kube-proxy-ipvs-to-nftables"},
		"TestKernelIPVSConnectionStartedWhileConntrackIsOffIsResetWhenAMasqueradeComesIn": {
			"conntrack-off-at-connect", "conntrack-on-at-connect"},
	}
}

// vmSkipReasons are the skips a VM run may hold besides a mode's
// unclaimed features, by test: the migrations proven on the host (the
// matrix's tours without ipvs, onlyWithIPVSInTheVM).
var vmSkipReasons = map[string][]string{
	"TestMigrateNodeEveryOrderedPairOfModesDropsNothing": {"proven on the host"},
	"TestMigrateNodeFromUpstreamKubeProxyDropsNothing":   {"proven on the host"},
}
