package vm

import (
	"testing"
	"time"
)

// TestNFTElementCountersOn61 runs nft's kernel tests of the endpoint slots
// on Debian 12's 6.1 kernel: the per-element counters of the endpoints map
// must be updated by the DNAT rule's lookup there too (kp's per-endpoint
// counts of new connections come from them), and a connection's rule walk
// must not grow with the number of endpoints; a Service port without
// session affinity, which has no chain or verdict of its own (its ClusterIP
// goes through the shared pick chains, by its service-slots element), must
// still be DNATed there.
func TestNFTElementCountersOn61(t *testing.T) {
	start := time.Now()
	run := "^(TestVMKernelIs61|TestKernelEndpointCountersCountRealConnections|TestKernelNewConnectionRuleWalkDoesNotGrowWithEndpoints|TestKernelPlainServicePortHasNoChainAndStillDNATs)$"
	out, err := RunPackage(t, Options{Timeout: 8 * time.Minute}, "./nft", run)
	if err != nil {
		t.Fatalf("nft kernel tests in the VM: %v\n%s", err, out)
	}
	// Each by name, and nothing skipped: a skip in the VM is a claim unproven.
	for _, e := range CheckRun(out, Claim{Pass: []string{
		"TestVMKernelIs61",
		"TestKernelEndpointCountersCountRealConnections",
		"TestKernelNewConnectionRuleWalkDoesNotGrowWithEndpoints",
		"TestKernelPlainServicePortHasNoChainAndStillDNATs",
	}}) {
		t.Errorf("in the VM: %v", e)
	}
	t.Logf("VM output:\n%s", out)
	t.Logf("whole VM test: %v", time.Since(start).Round(time.Millisecond))
}
