package vm

import (
	"strings"
	"testing"
	"time"
)

// TestNFTElementCountersOn61 runs nft's kernel tests of the endpoint slots
// on Debian 12's 6.1 kernel: the per-element counters of the endpoints map
// must be updated by the DNAT rule's lookup there too (kp's per-endpoint
// counts of new connections come from them), and a connection's rule walk
// must not grow with the number of endpoints; a Service port without
// session affinity, which has no chain of its own (its ClusterIP jumps from
// the service-ips map to its pick chain), must still be DNATed there.
func TestNFTElementCountersOn61(t *testing.T) {
	start := time.Now()
	run := "^(TestVMKernelIs61|TestKernelEndpointCountersCountRealConnections|TestKernelNewConnectionRuleWalkDoesNotGrowWithEndpoints|TestKernelPlainServicePortHasNoChainAndStillDNATs)$"
	out, err := RunPackage(t, Options{Timeout: 8 * time.Minute}, "./nft", run)
	if err != nil {
		t.Fatalf("nft kernel tests in the VM: %v\n%s", err, out)
	}
	for _, want := range []string{
		"--- PASS: TestVMKernelIs61",
		"--- PASS: TestKernelEndpointCountersCountRealConnections",
		"--- PASS: TestKernelNewConnectionRuleWalkDoesNotGrowWithEndpoints",
		"--- PASS: TestKernelPlainServicePortHasNoChainAndStillDNATs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("VM output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("VM output:\n%s", out)
	t.Logf("whole VM test: %v", time.Since(start).Round(time.Millisecond))
}
