package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// socketPath returns a socket path in a fresh directory short enough for
// sun_path (108 bytes), removed at the end of the test. Its parent is
// open to every user (0755, as /run), so that only the permissions kp
// sets refuse another user.
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "run", "kp.sock")
}

func TestSocketServesStatusAndRateLimitedInventory(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	health := NewHealth(time.Minute, clk)
	status := NewStatus(proxy.NoneBackend{}, "node-a", health, clk)
	var runs atomic.Int32
	h := socketHandler(status, func(context.Context) ([]statusapi.Program, error) {
		runs.Add(1)
		return []statusapi.Program{{Owner: "kube-proxy", Mode: "iptables/ipvs", Where: "iptables-nft IPv4", Chains: 3, Rules: 9}}, nil
	}, "node-a")
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	var st statusapi.Status
	if rec := get(statusapi.StatusPath); rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &st) != nil || st.Node != "node-a" || st.Mode != "none" {
		t.Errorf("GET %s: %d %s", statusapi.StatusPath, rec.Code, rec.Body)
	}
	var inv statusapi.Inventory
	for i := 0; i < 3; i++ {
		if rec := get(statusapi.InventoryPath); rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &inv) != nil || len(inv.Programs) != 1 {
			t.Errorf("GET %s: %d %s", statusapi.InventoryPath, rec.Code, rec.Body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("3 requests within a second ran the inventory %d times, want 1", n)
	}
	if rec := get(statusapi.ServicesPath); rec.Code != 200 {
		t.Errorf("GET %s: %d", statusapi.ServicesPath, rec.Code)
	}
	if rec := get("/debug/pprof/"); rec.Code != 200 {
		t.Errorf("GET /debug/pprof/ on the socket: %d", rec.Code)
	}
}

// networkPaths are what a client on the network asks: upstream's paths,
// every path kp served on the network before issue 34, and a few others.
var networkPaths = []string{
	"/healthz", "/livez", "/metrics", "/proxyMode",
	statusapi.StatusPath, statusapi.ServicesPath, statusapi.InventoryPath, statusapi.MigrationPath,
	"/kp/", "/kp/v1/", "/debug/pprof/", "/debug/pprof/cmdline", "/configz", "/readyz", "/", "/status", "/x",
}

// upstreamPaths are the paths upstream kube-proxy (v1.36) serves on each
// server that kp serves too: its healthz server's two, and on its metrics
// server /metrics, /proxyMode and the generic /healthz.
var upstreamPaths = map[string]map[string]bool{
	"healthz": {"/healthz": true, "/livez": true},
	"metrics": {"/healthz": true, "/metrics": true, "/proxyMode": true},
}

func TestNetworkServesOnlyUpstreamPathsAndStatusIsOnTheSocket(t *testing.T) {
	cfg := testConfig()
	cfg.HealthzBindAddress, cfg.MetricsBindAddress, cfg.StatusSocket = freeAddr(t), freeAddr(t), socketPath(t)
	backend := newFakeBackend(0)
	_, stop := startRun(t, cfg, backend, &fakeSource{})
	backend.expectSync(t)
	for server, addr := range map[string]string{"healthz": cfg.HealthzBindAddress, "metrics": cfg.MetricsBindAddress} {
		for _, path := range networkPaths {
			for _, method := range []string{http.MethodGet, http.MethodPost} {
				req, _ := http.NewRequest(method, "http://"+addr+path, nil)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatalf("%s %s on %s: %v", method, path, server, err)
				}
				resp.Body.Close()
				served := resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed
				if method == http.MethodGet && served != upstreamPaths[server][path] ||
					method == http.MethodPost && served && !upstreamPaths[server][path] {
					t.Errorf("%s %s on the %s port: %d, want served only if upstream serves it (%v)",
						method, path, server, resp.StatusCode, upstreamPaths[server][path])
				}
			}
		}
	}
	c := statusapi.SocketClient(cfg.StatusSocket)
	if st, err := c.Status(context.Background()); err != nil || st.Node != "node-a" {
		t.Errorf("status through the socket: %+v %v", st, err)
	}
	if _, err := c.Inventory(context.Background()); err != nil {
		t.Errorf("inventory through the socket: %v", err)
	}
	assertMode(t, cfg.StatusSocket, socketFileMode)
	assertMode(t, filepath.Dir(cfg.StatusSocket), socketDirMode|os.ModeDir)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(cfg.StatusSocket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is left after Run returned: %v", err)
	}
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() &^ os.ModeSocket; got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Geteuid() {
		t.Errorf("%s: owner %d, want kp's user %d", path, st.Uid, os.Geteuid())
	}
}

func TestListenSocketTakesOverAStaleSocketAndRefusesALiveOneOrAForeignDirectory(t *testing.T) {
	path := socketPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // the file stays, nothing answers: a kp that was killed
	ln, err := listenSocket(path)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	defer ln.Close()
	assertMode(t, filepath.Dir(path), socketDirMode|os.ModeDir) // 0755 made 0700, as kubelet's DirectoryOrCreate
	if _, err := listenSocket(path); err == nil {
		t.Error("a second kp listened on a live socket")
	}
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	foreign := socketPath(t)
	if err := os.MkdirAll(filepath.Dir(foreign), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Dir(foreign), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := listenSocket(foreign); err == nil {
		t.Error("listened in a directory owned by another user")
	}
}

// TestStatusSocketRefusesNonRoot runs a client as uid 65534 (nobody), in a
// process of its own: it must get EACCES, while root reads the status.
func TestStatusSocketRefusesNonRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	path := socketPath(t)
	status := NewStatus(proxy.NoneBackend{}, "node-a", nil, clocktesting.NewFakeClock(time.Now()))
	ln, err := listenSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: socketHandler(status, nil, "node-a")}
	go srv.Serve(ln)
	defer srv.Close()
	if _, err := statusapi.SocketClient(path).Status(context.Background()); err != nil {
		t.Fatalf("root: %v", err)
	}
	out, err := runAsNobody(t, "TestStatusSocketClientHelper", "KP_TEST_SOCKET="+path)
	t.Logf("client as uid 65534: %s", out)
	if err != nil || out != "EACCES" {
		t.Errorf("client as uid 65534: %q %v, want EACCES", out, err)
	}
}

// TestStatusSocketClientHelper is the client TestStatusSocketRefusesNonRoot
// runs as nobody; it prints EACCES, the body it read, or the error.
func TestStatusSocketClientHelper(t *testing.T) {
	path := os.Getenv("KP_TEST_SOCKET")
	if path == "" {
		t.Skip("run by TestStatusSocketRefusesNonRoot")
	}
	c, err := net.Dial("unix", path)
	switch {
	case errors.Is(err, syscall.EACCES):
		fmt.Print("EACCES")
	case err != nil:
		fmt.Print(err)
	default:
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.0\r\n\r\n", statusapi.StatusPath)
		body, _ := io.ReadAll(c)
		fmt.Printf("read %d bytes: %.80q", len(body), body)
	}
	os.Exit(0)
}

// runAsNobody runs this test binary's test helper as uid and gid 65534
// with env added, and returns its output. The binary is copied to a
// directory nobody may read (go test's is root's only).
func runAsNobody(t *testing.T, helper string, env ...string) (string, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "kpn")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "server.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^"+helper+"$")
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	return string(out), err
}
