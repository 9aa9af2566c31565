package migrate

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kpproxy/kp/internal/kubeclient/fromclientset"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// The Node annotation kpproxy.io/proxy-mode=none takes the node's Services
// offline unless another proxy serves them: without --allow-mode-none kp
// refuses it, at start and later, changes nothing (no backend built,
// synced or cleaned, no rule retired) and records why as a Warning Event
// on its Node (NodeEvents, the API write kp proxy makes). With the flag the
// annotation switches kp to none, as kp migrate cluster --rollback needs.
func TestSwitcherRefusesTheNoneAnnotationWithoutAllowModeNone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start bool // the annotation is there when kp starts
	}{{"at start", true}, {"while kp runs", false}} {
		t.Run(tc.name, func(t *testing.T) {
			var log []string
			s := newTestSwitcher(&log, nil)
			client := fake.NewClientset()
			s.SetFinished(NodeEvents(fromclientset.New(client), "n1", slog.New(slog.DiscardHandler)))
			ctx := context.Background()
			st := &proxy.State{Node: proxy.Node{Name: "n1"}}
			if !tc.start {
				if err := s.Sync(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			log = nil
			st.Node.ProxyMode = "none"
			for range 2 { // the same annotation again is no new request
				if err := s.Sync(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			want := []string{"nftables sync", "nftables sync"}
			if tc.start {
				want = []string{"nftables sync", "retire all but nftables", "nftables sync"}
			}
			if !slices.Equal(log, want) || s.Mode() != proxy.ModeNFTables {
				t.Errorf("calls %q, mode %s; want %q, nftables", log, s.Mode(), want)
			}
			m := s.Migration()
			if m == nil || m.Phase != statusapi.MigrationFailed || m.To != "none" || !strings.Contains(m.Error, "--allow-mode-none") {
				t.Errorf("progress %+v, want a failed switch to none naming --allow-mode-none", m)
			}
			evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs.Items) != 1 {
				t.Fatalf("%d Events, want 1: %+v", len(evs.Items), evs.Items)
			}
			ev := evs.Items[0]
			if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != "n1" || ev.Type != "Warning" ||
				ev.Reason != "KPModeSwitchFailed" || !strings.Contains(ev.Message, "--allow-mode-none") ||
				!strings.Contains(ev.Message, "nothing changed") {
				t.Errorf("Event %s %s on %s/%s: %q", ev.Type, ev.Reason, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Message)
			}
		})
	}
	t.Run("allowed", func(t *testing.T) {
		var log []string
		s := newTestSwitcher(&log, nil)
		s.cfg.AllowModeNone = true
		ctx := context.Background()
		st := &proxy.State{Node: proxy.Node{Name: "n1"}}
		if err := s.Sync(ctx, st); err != nil {
			t.Fatal(err)
		}
		st.Node.ProxyMode = "none"
		if err := s.Sync(ctx, st); err != nil {
			t.Fatal(err)
		}
		if m := s.Migration(); s.Mode() != proxy.ModeNone || m.Phase != statusapi.MigrationSucceeded {
			t.Errorf("mode %s, progress %+v; want none, succeeded", s.Mode(), m)
		}
	})
}
