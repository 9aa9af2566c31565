package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/vm"
)

// The VM runner's check, on the suite's own verbose output (the
// testdata: TestServiceWithoutEndpointsIsRefusedAtOnce and
// TestDeletedServiceNoLongerAnswers run with KP_E2E_MODES=nftables,ipvs on
// a kernel without IPVS, so every ipvs subtest skipped and every nftables
// one passed): a mode whose subtests skip fails the run, though another
// mode passed; a skip with the reason the unclaimed table gives passes; a
// claimed test that never ran fails.
func TestVMRunnerRequiresEveryClaimedModeSubtestByName(t *testing.T) {
	data, err := os.ReadFile("testdata/vm-output-ipvs-skipped.txt")
	if err != nil {
		t.Fatal(err)
	}
	captured := string(data)
	hostSkip := "ipvs mode: this kernel has no IPVS (no /proc/net/ip_vs); TestIPVSModeInTheVM runs it in the VM"
	unclaimedSkip := "ipvs mode does not claim " + string(featureServiceComments) + ": " + unclaimed["ipvs"][featureServiceComments]
	both := []string{"TestServiceWithoutEndpointsIsRefusedAtOnce", "TestDeletedServiceNoLongerAnswers"}
	for _, tc := range []struct {
		name  string
		out   string
		modes []string
		tests []string
		want  []string // each a substring of one error, in order
	}{{
		name: "one mode's subtests skipped while the other's passed", out: captured,
		modes: []string{"nftables", "ipvs"}, tests: both,
		want: []string{
			"TestDeletedServiceNoLongerAnswers/ipvs skipped with a reason not in its committed list",
			"TestServiceWithoutEndpointsIsRefusedAtOnce/ipvs skipped with a reason not in its committed list",
		},
	}, {
		name: "a skip with the mode's unclaimed reason", out: strings.ReplaceAll(captured, hostSkip, unclaimedSkip),
		modes: []string{"nftables", "ipvs"}, tests: both,
	}, {
		name: "the unclaimed reason of another mode", out: strings.ReplaceAll(strings.ReplaceAll(captured, hostSkip, unclaimedSkip), "/ipvs", "/iptables-nft"),
		modes: []string{"nftables", "iptables-nft"}, tests: both,
		want: []string{
			"TestDeletedServiceNoLongerAnswers/iptables-nft skipped with a reason not in its committed list",
			"TestServiceWithoutEndpointsIsRefusedAtOnce/iptables-nft skipped with a reason not in its committed list",
		},
	}, {
		name: "a claimed test that never ran", out: strings.ReplaceAll(captured, hostSkip, unclaimedSkip),
		modes: []string{"nftables", "ipvs"}, tests: append(both, "TestNodePortAnswersFromOffNodeClient"),
		want: []string{"TestNodePortAnswersFromOffNodeClient never ran", "TestNodePortAnswersFromOffNodeClient/nftables never ran",
			"TestNodePortAnswersFromOffNodeClient/ipvs never ran"},
	}, {
		name: "a failed subtest", out: strings.Replace(captured, "--- PASS: TestDeletedServiceNoLongerAnswers/nftables", "--- FAIL: TestDeletedServiceNoLongerAnswers/nftables", 1),
		modes: []string{"nftables"}, tests: both,
		want: []string{"TestDeletedServiceNoLongerAnswers/ipvs skipped", "TestDeletedServiceNoLongerAnswers/nftables failed",
			"TestServiceWithoutEndpointsIsRefusedAtOnce/ipvs skipped"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			results, err := vm.ParseResults(tc.out)
			if err != nil {
				t.Fatal(err)
			}
			errs := vmClaim(tc.modes, tc.tests, false).Check(results)
			if len(errs) != len(tc.want) {
				t.Fatalf("%d errors, want %d: %v", len(errs), len(tc.want), errs)
			}
			for i, e := range errs {
				t.Logf("the runner reports: %v", e)
				if !strings.Contains(e.Error(), tc.want[i]) {
					t.Errorf("error %d = %v, want it to say %q", i, e, tc.want[i])
				}
			}
		})
	}
}
