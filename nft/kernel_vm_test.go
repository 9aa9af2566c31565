package nft

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestVMKernelIs61 names the kernel the VM run of this package's kernel
// tests happened on (test/vm's TestNFTElementCountersOn61 boots Debian's 6.1
// and runs it with the endpoint counter tests). Outside the VM it skips.
func TestVMKernelIs61(t *testing.T) {
	if os.Getenv("KP_VM") != "1" {
		t.Skip("skipped: runs inside the VM (test/vm's TestNFTElementCountersOn61 boots it)")
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if !strings.HasPrefix(release, "6.1.") {
		t.Fatalf("uname -r = %q, want 6.1.*", release)
	}
	t.Logf("kernel %s", release)
}
