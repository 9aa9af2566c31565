package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// A write to kp's status API (on its root-only socket, where mode switches
// are taken) must be JSON with a printable requestedBy: a text/plain POST, as
// a browser on the node sends cross-origin without a CORS preflight, is
// refused with 415 and switches nothing, as is a requestedBy that would
// forge a line of the Node's Event; kp migrate node, kp's own client,
// still switches.
func TestStatusAPIWritesAreJSONOnly(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "ip6tables-nft-save")
	e := newEnv(t, modeNFTables, 1)
	e.write("web.yaml", web(e.w.Pods()...))
	e.startKP()
	sc := e.statusClient()
	post := func(contentType, body string) (int, string) {
		t.Helper()
		resp, err := sc.HTTP.Post(sc.BaseURL+statusapi.MigrationPath, contentType, strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", statusapi.MigrationPath, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := post("text/plain", `{"to":"iptables-nft"}`); code != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain POST: %d %q, want 415", code, body)
	}
	if code, body := post("application/json", `{"to":"iptables-nft","requestedBy":"me\nkp switched"}`); code != http.StatusBadRequest {
		t.Errorf("requestedBy with a newline: %d %q, want 400", code, body)
	}
	if m, err := sc.Migration(t.Context()); err != nil || m != nil {
		t.Errorf("after the refused writes, GET %s: %+v %v, want null (no switch asked)", statusapi.MigrationPath, m, err)
	}
	e.expectOnly("nftables")
	out := e.migrate("--to", "iptables-nft")
	e.expectOnly("iptables-nft")
	if m, err := sc.Migration(t.Context()); err != nil || m == nil || m.RequestedBy != "kp migrate node" || m.Phase != "succeeded" {
		t.Errorf("kp migrate node through kp's client: GET %s: %+v %v\n%s", statusapi.MigrationPath, m, err, out)
	}
}
