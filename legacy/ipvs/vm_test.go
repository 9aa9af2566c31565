package ipvs

import (
	"os"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/vm"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// TestVMRunsTheKernelTests boots the 6.1 kernel (test/vm) and runs this
// package's TestKernel* inside it, with real packets in namespaces.
func TestVMRunsTheKernelTests(t *testing.T) {
	if os.Getenv("KP_VM") == "1" {
		t.Skip("already in the VM")
	}
	start := time.Now()
	out, err := vm.RunPackage(t, vm.Options{Timeout: 8 * time.Minute}, "./legacy/ipvs", "TestKernel", "-test.timeout=6m")
	t.Logf("VM run: %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("kernel tests in the VM: %v\n%s", err, out)
	}
	// Each by name, and no test of the pattern skipped (a skip in the VM
	// is a claim unproven).
	for _, e := range vm.CheckRun(out, vm.Claim{Pass: []string{
		"TestKernelRoundRobinSpreadsExactlyEvenlyAndSyncsOnlyTheChange",
		"TestKernelSourceHashingKeepsAClientOnOneEndpoint",
		"TestKernelOpenConnectionToARemovedEndpointKeepsWorkingUntilItCloses",
		"TestKernelNetlinkErrorNamesTheServiceAndTheNextSyncReconciles",
		"TestKernelCleanupLeavesForeignIPVSIPSetsAndChains",
		"TestKernelDriftCheckReadsTheTableAndFindsADeletedVirtualServer",
		"TestKernelAffinityEntryNamesTheEndpointThatAnswered",
	}}) {
		t.Errorf("in the VM: %v", e)
	}
	if t.Failed() {
		t.Logf("the VM's output:\n%s", out)
	}
	if testing.Verbose() {
		t.Log(out)
	}
}
