package server

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

func TestRunReportsWhichKPRunsInMetricsAndStatus(t *testing.T) {
	cfg := testConfig()
	cfg.MetricsBindAddress, cfg.StatusSocket = freeAddr(t), socketPath(t)
	backend := newFakeBackend(0)
	build := statusapi.Build{Version: "v1.2.3", Commit: "0123456789abcdef0123456789abcdef01234567", BuildDate: "2026-11-20T10:00:00Z"}
	_, stop := startRunWith(t, cfg, RunOptions{Backend: backend, Sources: []proxy.Source{&fakeSource{}}, Build: build})
	backend.expectSync(t)

	want := `kp_build_info{build_date="2026-11-20T10:00:00Z",commit="0123456789abcdef0123456789abcdef01234567",go_version="` +
		runtime.Version() + `",version="v1.2.3"} 1`
	if m := string(get(t, "http://"+cfg.MetricsBindAddress+"/metrics", http.StatusOK)); !strings.Contains(m, want) {
		t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "kp_build_info"))
	}
	st, err := statusapi.SocketClient(cfg.StatusSocket).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	build.GoVersion, build.Platform = runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	if st.Build == nil || *st.Build != build {
		t.Errorf("status build %+v, want %+v", st.Build, build)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
