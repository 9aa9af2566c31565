package vm

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// TestProbe boots the 6.1 kernel and runs test/vm/probe's tests inside it:
// the kernel release, IPVS with every scheduler kp offers, a dummy
// interface, nftables and both iptables backends in a namespace.
func TestProbe(t *testing.T) {
	start := time.Now()
	Require(t)
	bin := BuildTest(t, "./test/vm/probe")
	out, err := Run(t, Options{Timeout: 4 * time.Minute}, bin, "-test.v", "-test.count=1")
	if err != nil {
		t.Fatalf("probe tests in the VM: %v\n%s", err, out)
	}
	for _, want := range []string{"--- PASS: TestKernelIs61", "--- PASS: TestIPVSVirtualServerReadsBack", "--- PASS: TestNetnsTools"} {
		if !strings.Contains(out, want) {
			t.Errorf("VM output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("whole VM test: %v", time.Since(start).Round(time.Millisecond))
}

// TestExitStatusAndOutput: what the command prints comes back byte for byte
// (no \r from the serial line), and its exit status becomes an *ExitError.
func TestExitStatusAndOutput(t *testing.T) {
	out, err := Run(t, Options{Timeout: 3 * time.Minute}, "/bin/sh", "-c", "echo one; echo two >&2; exit 3")
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != 3 {
		t.Errorf("error = %v, want exit status 3", err)
	}
	if out != "one\ntwo\n" {
		t.Errorf("output = %q, want %q", out, "one\ntwo\n")
	}
}
