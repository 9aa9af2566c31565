package vm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	out, err := RunPackage(t, Options{Timeout: 6 * time.Minute}, "./test/vm/probe", "")
	if err != nil {
		t.Fatalf("probe tests in the VM: %v\n%s", err, out)
	}
	for _, e := range CheckRun(out, Claim{Pass: []string{"TestKernelIs61", "TestCryptoSelfTestsAreOff", "TestIPVSVirtualServerReadsBack", "TestNetnsTools"}}) {
		t.Errorf("in the VM: %v", e)
	}
	if t.Failed() {
		t.Logf("the VM's output:\n%s", out)
	}
	t.Logf("whole VM test: %v", time.Since(start).Round(time.Millisecond))
}

// TestOutputExitStatusAndReadOnlyRoot: what the command prints comes back
// byte for byte (no \r from the serial line), its exit status becomes an
// *ExitError, and it can write the overlaid folders but never the host's
// files, not even after remounting the root read-write.
func TestOutputExitStatusAndReadOnlyRoot(t *testing.T) {
	hostDir := t.TempDir() // under /tmp: overlaid in the guest
	usrFile := fmt.Sprintf("/usr/kp-vm-write-test-%d", os.Getpid())
	script := fmt.Sprintf(`echo one; echo two >&2
echo guest > %[1]s/from-guest && cat %[1]s/from-guest
mount -o remount,rw / 2>/dev/null
if touch %[2]s 2>/dev/null; then echo wrote %[2]s; else echo cannot write %[2]s; fi
exit 3`, hostDir, usrFile)
	out, err := Run(t, Options{Timeout: 4 * time.Minute}, "/bin/sh", "-c", script)
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != 3 {
		t.Errorf("error = %v, want exit status 3", err)
	}
	want := fmt.Sprintf("one\ntwo\nguest\ncannot write %s\n", usrFile)
	if out != want {
		t.Errorf("output = %q, want %q", out, want)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "from-guest")); err == nil {
		t.Errorf("the guest's write to its /tmp overlay reached the host's %s", hostDir)
	}
	if _, err := os.Stat(usrFile); err == nil {
		os.Remove(usrFile)
		t.Errorf("the guest wrote the host's %s", usrFile)
	}
}
