package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// Every write to the status API is JSON, bounded, and its requestedBy fit
// for an Event; what is refused asks for no switch.
func TestMigrationRequestsAreJSONBoundedAndValidated(t *testing.T) {
	valid := `{"to":"iptables-legacy","requestedBy":"kp migrate node"}`
	long := strings.Repeat("x", statusapi.MaxRequestBytes)
	for _, tc := range []struct {
		name, contentType, body string
		unknownLength           bool // sent chunked: no Content-Length to refuse it by
		code                    int
		by                      string // what reaches the switcher when accepted
	}{
		{"JSON", "application/json", valid, false, http.StatusAccepted, "kp migrate node"},
		{"JSON with a charset", "application/json; charset=utf-8", valid, false, http.StatusAccepted, "kp migrate node"},
		{"text/plain, as a browser posts without a CORS preflight", "text/plain", valid, false, http.StatusUnsupportedMediaType, ""},
		{"a form", "application/x-www-form-urlencoded", valid, false, http.StatusUnsupportedMediaType, ""},
		{"no content type", "", valid, false, http.StatusUnsupportedMediaType, ""},
		{"a malformed content type", "application/json; =", valid, false, http.StatusUnsupportedMediaType, ""},
		{"larger than the bound, by its length", "application/json", `{"to":"iptables","requestedBy":"` + long + `"}`, false,
			http.StatusRequestEntityTooLarge, ""},
		{"larger than the bound, chunked", "application/json", `{"to":"iptables","pad":"` + long + `"}`, true,
			http.StatusRequestEntityTooLarge, ""},
		{"data after the object", "application/json", valid + ` {"to":"ipvs"}`, false, http.StatusBadRequest, ""},
		{"requestedBy of 128 printable bytes", "application/json", `{"to":"ipvs","requestedBy":"` + strings.Repeat("é", 64) + `"}`, false,
			http.StatusAccepted, strings.Repeat("é", 64)},
		{"requestedBy of 129 bytes", "application/json", `{"to":"ipvs","requestedBy":"` + strings.Repeat("a", 129) + `"}`, false,
			http.StatusBadRequest, ""},
		{"requestedBy with a newline", "application/json", `{"to":"ipvs","requestedBy":"me\nkp switched from nftables to none"}`, false,
			http.StatusBadRequest, ""},
		{"requestedBy with an escape", "application/json", `{"to":"ipvs","requestedBy":"\u001b[2Jme"}`, false, http.StatusBadRequest, ""},
		{"requestedBy with a line separator", "application/json", `{"to":"ipvs","requestedBy":"me\u2028you"}`, false, http.StatusBadRequest, ""},
		{"requestedBy with a C1 newline", "application/json", `{"to":"ipvs","requestedBy":"me\u0085you"}`, false, http.StatusBadRequest, ""},
		// encoding/json decodes a byte that is not UTF-8 as U+FFFD, which
		// is printable: the Event shows it as such.
		{"requestedBy not UTF-8", "application/json", "{\"to\":\"ipvs\",\"requestedBy\":\"\xff\"}", false, http.StatusAccepted, "\uFFFD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &recordingMigrator{}
			s := NewStatus(m, "node-a", nil, clocktesting.NewFakeClock(time.Unix(0, 0)))
			r := httptest.NewRequest(http.MethodPost, statusapi.MigrationPath, strings.NewReader(tc.body))
			r.RemoteAddr = "127.0.0.1:40000"
			if tc.unknownLength {
				r.ContentLength = -1
			}
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, r)
			if rec.Code != tc.code {
				t.Fatalf("answered %d %q, want %d", rec.Code, rec.Body, tc.code)
			}
			if tc.code != http.StatusAccepted {
				if len(m.asked) != 0 {
					t.Errorf("refused, yet asked for a switch to %v", m.asked)
				}
				if strings.TrimSpace(rec.Body.String()) == "" {
					t.Error("refused without saying why")
				}
				return
			}
			if len(m.by) != 1 || m.by[0] != tc.by {
				t.Errorf("requestedBy reached the switcher as %q, want %q", m.by, tc.by)
			}
		})
	}
}

// kp's own client (kp migrate node's) sends what the server takes.
func TestStatusAPIClientSendsJSONTheServerAccepts(t *testing.T) {
	m := &recordingMigrator{}
	s := NewStatus(m, "node-a", nil, clocktesting.NewFakeClock(time.Unix(0, 0)))
	var contentType string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contentType = r.Header.Get("Content-Type")
		s.Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	c := &statusapi.Client{BaseURL: srv.URL}
	mig, err := c.RequestMigration(context.Background(), statusapi.MigrationRequest{To: "iptables-nft", RequestedBy: "kp migrate node"})
	if err != nil || mig.To != "iptables-nft" || len(m.asked) != 1 {
		t.Fatalf("RequestMigration: %+v %v; asked %v", mig, err, m.asked)
	}
	if contentType != statusapi.ContentType {
		t.Errorf("the client sent Content-Type %q, want %s", contentType, statusapi.ContentType)
	}
}

func TestMigrationRequestRefusesTheNoneMode(t *testing.T) {
	sw := migrate.NewSwitcher(migrate.SwitcherConfig{Initial: proxy.NoneBackend{}, InitialTarget: proxy.Target{Mode: proxy.ModeNFTables}})
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, statusapi.MigrationPath, strings.NewReader(`{"to":"none"}`))
	r.RemoteAddr = "127.0.0.1:40000"
	serveMigrationRequest(rec, r, sw)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "annotation") {
		t.Errorf("POST to none: %d %s, want 400 naming the annotation", rec.Code, rec.Body)
	}
	if sw.Migration() != nil {
		t.Errorf("a switch was recorded: %+v", sw.Migration())
	}
}
