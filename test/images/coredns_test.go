package images

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// The cluster's Corefile, run in a namespace of its own whose API server
// address answers nothing: CoreDNS must load it with the plugins linked,
// serve the cluster zone (SERVFAIL while its API is unsynced) and refuse
// every other name at once rather than forward it anywhere.
func TestCoreDNSLoadsTheCorefileAndRefusesNamesOutsideTheCluster(t *testing.T) {
	bin := Bin(t, "coredns")
	corefile, err := os.ReadFile(Corefile(t))
	if err != nil {
		t.Fatal(err)
	}
	netns.Require(t, "dig")
	ns := netns.NewNamespace(t, "dns")

	// In a pod, the kubernetes plugin finds the API from the service
	// account; here a kubeconfig names an address where nothing listens.
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: none}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	const plugin = "kubernetes cluster.local in-addr.arpa ip6.arpa {"
	if !strings.Contains(string(corefile), plugin) {
		t.Fatalf("Corefile has no %q block:\n%s", plugin, corefile)
	}
	conf := strings.Replace(string(corefile), plugin, plugin+"\n        kubeconfig "+kubeconfig, 1)
	confPath := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	p := netns.StartIn(t, ns, bin, "-conf", confPath)

	// CoreDNS waits up to 5 s for the API before it serves anyway.
	status := func(qname string) string {
		out, _ := netns.Exec(ns, "dig", "@127.0.0.1", "+tries=1", "+time=1", qname)
		for _, f := range strings.Split(out, ",") {
			if _, s, ok := strings.Cut(f, "status: "); ok {
				return strings.TrimSpace(s)
			}
		}
		return "no answer"
	}
	var got string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if !p.Running() {
			t.Fatalf("coredns exited: %v", p.ExitErr())
		}
		if got = status("example.com."); got != "no answer" {
			break
		}
	}
	if got != "REFUSED" {
		t.Errorf("example.com.: status %s, want REFUSED (no forward, names outside the cluster's zones are not served)", got)
	}
	if got := status("kubernetes.default.svc.cluster.local."); got == "REFUSED" || got == "no answer" {
		t.Errorf("kubernetes.default.svc.cluster.local.: status %s, want the kubernetes plugin's answer", got)
	}
	if got := status("1.0.96.10.in-addr.arpa."); got == "REFUSED" || got == "no answer" {
		t.Errorf("reverse zone: status %s, want the kubernetes plugin's answer", got)
	}
	if code, body, err := netns.HTTPGet(ns, "http://127.0.0.1:8080/health", 2*time.Second); err != nil || code != 200 {
		t.Errorf("health: %d %q %v", code, body, err)
	}

	// The glibc-dns-testing image's dig, run from its tree as upstream's
	// querier runs it (+search, the nameserver of /etc/resolv.conf), over
	// UDP and TCP, gets CoreDNS's answers.
	if _, err := os.Stat(filepath.Join(filepath.Dir(Corefile(t)), "glibc-dns-testing.tar")); err != nil {
		netns.Unavailable(t, "skipped: no glibc-dns-testing image (run make test-images): %v", err)
	}
	root := extract(t, Get(t, GlibcDNSTesting))
	if err := os.WriteFile(filepath.Join(root, "etc/resolv.conf"), []byte("nameserver 127.0.0.1\nsearch svc.cluster.local cluster.local\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A name with fewer dots than ndots goes out with the search suffix
	// (the cluster's, SERVFAIL while the API is unsynced); an absolute
	// one as it is (REFUSED: outside the cluster's zones).
	for _, transport := range []string{"+notcp", "+tcp"} {
		for _, q := range []struct{ qname, want string }{
			{"kubernetes.default", ";kubernetes.default.svc.cluster.local. "},
			{"example.com.", "status: REFUSED"},
		} {
			out, _ := netns.Exec(ns, "chroot", root, "dig", transport, "+search", "+tries=1", "+time=2", q.qname, "A")
			if !strings.Contains(out, q.want) {
				t.Errorf("glibc-dns-testing: dig %s +search %s: want %q, got:\n%s", transport, q.qname, q.want, out)
			}
		}
	}
}
