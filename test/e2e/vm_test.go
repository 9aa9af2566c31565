package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
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
	"TestExternalTrafficPolicyLocalKeepsTheClientIPAndUsesOnlyLocalEndpoints",
	"TestExternalTrafficPolicyClusterMasqueradesOutsideClients",
	"TestInternalTrafficPolicyLocalUsesOnlyThisNodesEndpoints",
	"TestTerminatingEndpointsServeOnlyWhenNoneIsReady",
	"TestTopologyHintsKeepTrafficInTheNodesZone",
	"TestLoadBalancerAndExternalIPsWithSourceRanges",
	"TestClusterIPRejectsOtherPortsAndUnallocatedServiceAddressesAreDropped",
	"TestIPv6OnlyServiceAnswersOnItsClusterIPAndNodePort",
	"TestNodePortAnswersOnlyOnTheNodePortAddresses",
	"TestServiceChangesOnALiveNodeLeaveNoStaleRules",
	"TestCleanupRemovesEveryKPRuleAndNothingElse",
	"TestUDPClientFollowsItsServerPodWhenThePodIsReplaced",
	"TestUDPClientFollowsARollingReplacement",
	"TestUDPClientThatStartedBeforeTheFirstEndpointGetsAnswers",
	"TestTCPConnectionsAreNotTouchedByConntrackCleanup",
	"TestStatusAPIReportsSyncsEndpointsAndNewConnections",
	"TestKpFlowsShowsTheConnectionsTheTestMade",
	"TestHealthCheckNodePortReportsLocalEndpoints",
	"TestMetricsEndpointHasUpstreamMetricsWithSensibleValues",
	"TestBadObjectsAreLoggedAndSkippedWhileTheRestWorks",
}

// TestIPVSModeInTheVM boots the 6.1 kernel (test/vm) and runs the suite's
// Service-feature tests there with KP_E2E_MODES=ipvs: the ipvs column of
// the README's feature table. kp and the echo server are built here and
// run there (KP_TEST_BINDIR). KP_VM_E2E_RUN replaces the -run pattern.
func TestIPVSModeInTheVM(t *testing.T) {
	if os.Getenv("KP_VM") == "1" {
		t.Skip("already in the VM")
	}
	skipUnselected(t, modeIPVS)
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
	pattern := "^(" + strings.Join(vmServiceTests, "|") + ")$"
	if p := os.Getenv("KP_VM_E2E_RUN"); p != "" {
		pattern = p
	}
	bin := vm.BuildTest(t, "./test/e2e")
	wd, _ := os.Getwd()
	start := time.Now()
	out, err := vm.Run(t, vm.Options{Timeout: 40 * time.Minute, MemoryMiB: 3072, Dir: wd,
		Env: []string{"KP_E2E_MODES=ipvs", netns.BinDirEnv + "=" + binDir}},
		bin, "-test.v", "-test.count=1", "-test.timeout=38m", "-test.run", pattern)
	t.Logf("the ipvs column in the VM: %v", time.Since(start).Round(time.Second))
	passed := regexp.MustCompile(`(?m)^\s*--- PASS: (\S+/ipvs)`).FindAllStringSubmatch(out, -1)
	skipped := regexp.MustCompile(`(?m)^\s*--- SKIP: (\S+/ipvs)`).FindAllStringSubmatch(out, -1)
	t.Logf("ipvs subtests: %d passed, %d skipped (unclaimed)", len(passed), len(skipped))
	if err != nil {
		t.Fatalf("the e2e suite in ipvs mode in the VM: %v\n%s", err, out)
	}
	if len(passed) == 0 {
		t.Fatalf("no ipvs subtest passed:\n%s", out)
	}
	if testing.Verbose() {
		t.Log(out)
	}
}
