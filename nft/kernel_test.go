package nft

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/test/netns"
)

// testNetns creates a network namespace for one test and deletes it when the
// test ends, whatever the outcome. It returns the name and an open fd.
func testNetns(t *testing.T) (string, int) {
	t.Helper()
	netns.Require(t, "nft")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "kp-nft-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return name, fd
}

func nftIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestKernelRulesetListsAndReloadsWithNFT(t *testing.T) {
	ns, fd := testNetns(t)
	b, err := NewInNamespace(testConfig(), nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	web := spName("demo", "web", "http")
	w.addService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080", "10.244.1.3:8080")
	w.addService(spName("demo", "empty", ""), "10.96.0.11", 53, 0)
	mustSync(t, b, w.state())

	listing := nftIn(t, ns, "list", "ruleset")
	for _, want := range []string{
		`comment "demo/web:http"`,
		// numgen's keys in host order would list as 16777216.
		"numgen random mod 2 vmap { 0 : goto ep-demo/web/tcp/http__10.244.1.2/8080, 1 : goto ep-demo/web/tcp/http__10.244.1.3/8080 }",
		"dnat to 10.244.1.3:8080",
		`10.96.0.11 . tcp . 53 comment "demo/empty" : goto reject-chain`,
		"counter ep-demo/web/tcp/http__10.244.1.2/8080",
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("nft list ruleset lacks %q:\n%s", want, listing)
		}
	}
	// What kp wrote must load back with the nft CLI: the listing is a
	// faithful, parseable description (operators debug with it).
	ns2, _ := testNetns(t)
	path := t.TempDir() + "/ruleset.nft"
	if err := os.WriteFile(path, []byte(listing), 0o644); err != nil {
		t.Fatal(err)
	}
	nftIn(t, ns2, "-f", path)
	if reloaded := nftIn(t, ns2, "list", "ruleset"); reloaded != listing {
		t.Errorf("the listing does not reload to itself:\n--- kp wrote ---\n%s\n--- reloaded ---\n%s", listing, reloaded)
	}

	// Partial sync against the real kernel, then a new backend (kp
	// restarted) reconciling over the existing table.
	w.setEndpoints(web, "10.244.1.2:8080")
	mustSync(t, b, w.state())
	b2, _ := NewInNamespace(testConfig(), nil, fd)
	mustSync(t, b2, w.state())
	if b2.LastTransactionOps() == 0 {
		t.Error("restart reconcile sent nothing")
	}
	listing = nftIn(t, ns, "list", "ruleset")
	if strings.Contains(listing, "10.244.1.3") {
		t.Errorf("removed endpoint still programmed:\n%s", listing)
	}
}

func TestKernelCleanupTouchesNothingElse(t *testing.T) {
	ns, fd := testNetns(t)
	nftIn(t, ns, "add", "table", "inet", "other")
	nftIn(t, ns, "add", "chain", "inet", "other", "input", "{ type filter hook input priority 0; }")
	b, _ := NewInNamespace(testConfig(), nil, fd)
	w := newWorld()
	w.addService(spName("a", "b", ""), "10.96.0.1", 80, 0, "10.244.0.1:80")
	mustSync(t, b, w.state())
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	listing := nftIn(t, ns, "list", "ruleset")
	if strings.Contains(listing, "table ip kp") || strings.Contains(listing, "table ip6 kp") {
		t.Errorf("kp tables left:\n%s", listing)
	}
	if !strings.Contains(listing, "table inet other") || !strings.Contains(listing, "chain input") {
		t.Errorf("cleanup touched another table:\n%s", listing)
	}
	// Cleanup with nothing to clean succeeds.
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
}
