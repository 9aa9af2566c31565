package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// On the network kp serves what upstream kube-proxy (v1.36) serves and
// nothing more (issue 34). kp runs with both servers on every address, as
// clusters that scrape metrics from Prometheus do; a client in another
// network namespace asks each port for upstream's paths, every path kp
// served on the network before (status, services, inventory, migration,
// profiles) and a few others: only upstream's answer 200, the rest 404.
// kp's own clients read the same status through the socket meanwhile.
func TestNetworkServesOnlyUpstreamPathsFromAnotherNamespace(t *testing.T) {
	e := newEnv(t, modeNFTables, 1)
	e.write("web.yaml", web(e.w.Pods()...))
	e.startKP("--healthz-bind-address", "0.0.0.0:10256", "--metrics-bind-address", "0.0.0.0:10249")
	upstream := map[string][]string{
		"10256": {"/healthz", "/livez"},
		"10249": {"/healthz", "/metrics", "/proxyMode"},
	}
	paths := []string{"/healthz", "/livez", "/metrics", "/proxyMode",
		statusapi.StatusPath, statusapi.ServicesPath, statusapi.InventoryPath, statusapi.MigrationPath,
		statusapi.ServicesPath + "?namespace=default", "/kp/", "/kp/v1/", "/kp/v2/status",
		"/debug/pprof/", "/debug/pprof/goroutine", "/debug/pprof/cmdline", "/configz", "/flagz", "/statusz",
		"/metrics/slis", "/readyz", "/", "/status", "/api/v1/pods", fmt.Sprintf("/r%d", time.Now().UnixNano()%1000)}
	client := e.w.Client()
	for port, served := range upstream {
		for _, path := range paths {
			want := http.StatusNotFound
			if slices.Contains(served, path) {
				want = http.StatusOK
			}
			url := "http://" + e.w.NodeIP().String() + ":" + port + path
			code, body, err := e.w.HTTPGet(client, url, 5*time.Second)
			if err != nil {
				t.Fatalf("GET %s from %s: %v", url, client, err)
			}
			if code != want {
				t.Errorf("GET %s from another namespace: %d (%.60q), want %d", url, code, body, want)
			}
		}
	}
	if st, err := e.statusClient().Status(t.Context()); err != nil || st.Mode != "nftables" || st.Node != nodeName {
		t.Errorf("status through the socket: %+v %v", st, err)
	}
}

// kp's status socket is root's alone: kp status run as uid 65534 (setpriv)
// is refused with EACCES, while root reads it, through the same binary.
func TestStatusSocketRefusesANonRootUser(t *testing.T) {
	netns.Require(t, "setpriv")
	e := newEnv(t, modeNFTables, 1)
	e.write("web.yaml", web(e.w.Pods()...))
	e.startKP()
	kp := exposedKP(t)
	out, err := runExposed(kp, "status", "--status-socket", e.socket)
	if err != nil || !strings.Contains(string(out), "mode:     nftables") {
		t.Fatalf("kp status as root: %v\n%s", err, out)
	}
	out, err = runExposed("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
		kp, "status", "--status-socket", e.socket)
	t.Logf("kp status as uid 65534: %v\n%s", err, out)
	if err == nil || !strings.Contains(string(out), "permission denied") {
		t.Errorf("kp status as uid 65534: %v, want permission denied (EACCES)\n%s", err, out)
	}
	for _, p := range []struct {
		path string
		want os.FileMode
	}{{filepath.Dir(e.socket), os.ModeDir | 0o700}, {e.socket, os.ModeSocket | 0o600}} {
		if fi, err := os.Stat(p.path); err != nil || fi.Mode() != p.want {
			t.Errorf("%s: %v %v, want mode %v", p.path, fi.Mode(), err, p.want)
		}
	}
}

// exposedKP copies kp to a directory every user may read, for a test that
// runs it as another user (netns.Build's folder is root's).
func exposedKP(t *testing.T) string {
	t.Helper()
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "kpbin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data, err := os.ReadFile(kp)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "kp")
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// runExposed runs a command, retrying while a copy just written is still
// open for writing in a child another test forked meanwhile (ETXTBSY
// until that child execs).
func runExposed(name string, args ...string) ([]byte, error) {
	for i := 0; ; i++ {
		out, err := exec.Command(name, args...).CombinedOutput()
		if i < 50 && (errors.Is(err, syscall.ETXTBSY) || strings.Contains(string(out), "Text file busy")) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		return out, err
	}
}
