package release

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// armCorePackages are the packages of the arm64 binary whose unit tests
// need no kernel: the core (model, change tracking, endpoint selection)
// and the server (sync loop, metrics, health, status API). The backends'
// render tests sit beside kernel tests, which qemu-user cannot serve (it
// refuses NETLINK_NETFILTER sockets); proxy/source's client-go fakes
// would add about 200 packages to compile for arm64 (5 minutes cold on
// 2 cores, with proxy/).
var armCorePackages = []string{"./proxy/", "./proxy/server/"}

// armSkipped are tests that start their own test binary again as another
// user: without binfmt_misc the host cannot exec an arm64 file.
const armSkipped = "^TestStatusSocketRefusesNonRoot$"

// The core's unit tests pass on arm64: built for it and run under
// qemu-aarch64-static (go test -exec), so a word-size, alignment or
// endianness assumption of amd64 fails here, not on an arm64 node.
func TestCoreUnitTestsPassOnArm64(t *testing.T) {
	qemu := qemuUser(t, "arm64")
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	args := append([]string{"test", "-count=1", "-exec", qemu, "-skip", armSkipped}, armCorePackages...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("GOARCH=arm64 go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, pkg := range armCorePackages {
		if !strings.Contains(string(out), "ok  \tgithub.com/kpproxy/kp/"+strings.Trim(pkg, "./")) {
			t.Errorf("no ok line for %s:\n%s", pkg, out)
		}
	}
	t.Logf("GOARCH=arm64 go %s (%v):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Second), out)
}
