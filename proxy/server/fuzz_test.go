package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// recordingMigrator is a backend that can switch modes and records every
// switch it is asked for (and switches nothing).
type recordingMigrator struct {
	proxy.NoneBackend
	asked []proxy.Target
	by    []string
}

func (m *recordingMigrator) Current() (proxy.Backend, proxy.Target) {
	return m, proxy.Target{Mode: proxy.ModeNFTables}
}
func (m *recordingMigrator) Migration() *statusapi.Migration { return nil }
func (m *recordingMigrator) Request(t proxy.Target, by string) (*statusapi.Migration, error) {
	m.asked, m.by = append(m.asked, t), append(m.by, by)
	return &statusapi.Migration{To: t.String(), RequestedBy: by}, nil
}

// FuzzMigrationRequest sends arbitrary bytes from an arbitrary client
// address as the body of POST /kp/v1/migration, through the status API's
// handler, twice: as text/plain, which is always refused (415) and asks
// for no switch, and as JSON. Nothing may panic; a refused request (any
// answer but 202) names what was wrong and asks for no switch; an accepted
// one (from any address: the handler is served on the root-only socket
// alone, which is the gate) is one JSON object of at most MaxRequestBytes
// whose requestedBy is valid (ValidRequestedBy: no newline, printable, at
// most 128 bytes), asks for exactly the switch its body names (never to
// none) with that requestedBy, and answers JSON. Seeds: the committed
// corpus (testdata/fuzz/FuzzMigrationRequest).
func FuzzMigrationRequest(f *testing.F) {
	f.Add([]byte(`{"to":"iptables-legacy","requestedBy":"kp migrate node"}`), "127.0.0.1:40000")
	f.Fuzz(func(t *testing.T, body []byte, remote string) {
		post := func(contentType string) (*recordingMigrator, *httptest.ResponseRecorder, *http.Request) {
			m := &recordingMigrator{}
			s := NewStatus(m, "node-a", nil, clocktesting.NewFakeClock(time.Unix(0, 0)))
			r := httptest.NewRequest(http.MethodPost, statusapi.MigrationPath, bytes.NewReader(body))
			r.RemoteAddr = remote
			r.Header.Set("Content-Type", contentType)
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, r)
			return m, rec, r
		}
		if m, rec, _ := post("text/plain"); rec.Code != http.StatusUnsupportedMediaType || len(m.asked) != 0 {
			t.Fatalf("text/plain: answered %d %q, asked for %v; want 415 and no switch", rec.Code, rec.Body, m.asked)
		}
		m, rec, _ := post(statusapi.ContentType)
		if rec.Code != http.StatusAccepted {
			if len(m.asked) != 0 {
				t.Fatalf("answered %d %q, yet asked for a switch to %v", rec.Code, rec.Body, m.asked)
			}
			if strings.TrimSpace(rec.Body.String()) == "" {
				t.Fatalf("answered %d without saying why", rec.Code)
			}
			return
		}
		if len(body) > statusapi.MaxRequestBytes {
			t.Fatalf("accepted a body of %d bytes", len(body))
		}
		var req statusapi.MigrationRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		if err := dec.Decode(&req); err != nil {
			t.Fatalf("accepted a body that does not decode: %v", err)
		}
		if dec.More() {
			t.Fatalf("accepted a body with data after its JSON object: %q", body)
		}
		if err := statusapi.ValidRequestedBy(req.RequestedBy); err != nil {
			t.Fatalf("accepted requestedBy %q: %v", req.RequestedBy, err)
		}
		want, err := proxy.ParseTarget(req.To)
		if err != nil || want.Mode == proxy.ModeNone {
			t.Fatalf("accepted a switch to %q (%v)", req.To, err)
		}
		if len(m.asked) != 1 || m.asked[0] != want {
			t.Fatalf("body asks for %v, the switcher was asked for %v", want, m.asked)
		}
		if req.RequestedBy == "" && m.by[0] != "status API" || req.RequestedBy != "" && m.by[0] != req.RequestedBy {
			t.Fatalf("requestedBy %q reached the switcher as %q", req.RequestedBy, m.by[0])
		}
		var mig statusapi.Migration
		if err := json.Unmarshal(rec.Body.Bytes(), &mig); err != nil || mig.To != want.String() {
			t.Fatalf("answer %q: %v", rec.Body, err)
		}
	})
}

// FuzzServicesQuery sends an arbitrary query string to GET
// /kp/v1/services (namespace= and service= select): nothing may panic, and
// the answer is always a JSON list holding only the service ports the
// query selects. Seeds: the committed corpus
// (testdata/fuzz/FuzzServicesQuery).
func FuzzServicesQuery(f *testing.F) {
	f.Add("namespace=ns&service=web")
	f.Fuzz(func(t *testing.T, rawQuery string) {
		clk := clocktesting.NewFakeClock(time.Unix(0, 0))
		s := NewStatus(&fakeBackend{}, "node-a", nil, clk)
		s.Succeeded(statusTestState(), clk.Now(), clk.Now(), true)
		r := httptest.NewRequest(http.MethodGet, statusapi.ServicesPath, nil)
		r.URL.RawQuery = rawQuery
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, r)
		var got statusapi.Services
		if err := json.Unmarshal(rec.Body.Bytes(), &got); rec.Code != http.StatusOK || err != nil {
			t.Fatalf("query %q: %d %q (%v)", rawQuery, rec.Code, rec.Body, err)
		}
		q, _ := url.ParseQuery(rawQuery)
		for _, sp := range got.ServicePorts {
			if ns := q.Get("namespace"); ns != "" && sp.Namespace != ns {
				t.Fatalf("query %q listed %s/%s", rawQuery, sp.Namespace, sp.Name)
			}
			if name := q.Get("service"); name != "" && sp.Name != name {
				t.Fatalf("query %q listed %s/%s", rawQuery, sp.Namespace, sp.Name)
			}
		}
	})
}
