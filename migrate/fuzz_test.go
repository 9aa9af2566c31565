package migrate

import (
	"cmp"
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/migrate/cluster"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// maxEventMessage bounds the Event kp records for a refused annotation,
// whatever the value's size (up to 256 KiB): events.k8s.io's limit of a
// note.
const maxEventMessage = 1024

// FuzzNodeAnnotations feeds arbitrary values of the Node annotations kp
// reads, which whoever may patch the Node writes: kpproxy.io/proxy-mode,
// which kp proxy acts on (the Switcher, at start or while it runs, with
// or without --allow-mode-none), and kpproxy.io/migration, which kp
// migrate cluster reads back on a re-run (RecordOf, NewPlan). Nothing may
// panic; a value refused is refused with an error naming the annotation,
// short enough for an Event, and nothing is applied: no backend built,
// synced, cleaned or retired beyond what the running mode does anyway, no
// plan made. A mode accepted is the mode kp runs afterwards. Seeds: the
// committed corpus (go run ./test/fuzzsync/seedcorpus).
func FuzzNodeAnnotations(f *testing.F) {
	f.Add("iptables-legacy", false, false, `{"kind":"to","to":"iptables","phase":"running","time":"2026-11-27T00:00:00Z"}`)
	f.Fuzz(func(t *testing.T, mode string, allowNone, atStart bool, record string) {
		fuzzProxyModeAnnotation(t, mode, allowNone, atStart)
		fuzzMigrationAnnotation(t, record)
	})
}

func fuzzProxyModeAnnotation(t *testing.T, mode string, allowNone, atStart bool) {
	var log []string
	s := newTestSwitcher(&log, nil)
	s.cfg.AllowModeNone = allowNone
	var finished []statusapi.Migration
	s.SetFinished(func(m statusapi.Migration) { finished = append(finished, m) })
	ctx := context.Background()
	st := &proxy.State{Node: proxy.Node{Name: "n1"}}
	if !atStart {
		if err := s.Sync(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	log = nil
	st.Node.ProxyMode = mode
	for range 2 { // the same value again is no new request
		if err := s.Sync(ctx, st); err != nil {
			t.Fatalf("annotation %q: sync: %v", mode, err)
		}
	}

	want, err := proxy.ParseTarget(mode)
	refused := mode != "" && (err != nil || want.Mode == proxy.ModeNone && !allowNone)
	if !refused {
		for _, m := range finished {
			if m.Phase != statusapi.MigrationSucceeded {
				t.Fatalf("annotation %q (allow none %v): switch %+v, want none or succeeded", mode, allowNone, m)
			}
		}
		if wantMode := cmp.Or(want.Mode, proxy.ModeNFTables); s.Mode() != wantMode {
			t.Fatalf("annotation %q: kp runs %s, want %s", mode, s.Mode(), wantMode)
		}
		return
	}
	// Refused: only the running mode's own work, as with no annotation.
	wantLog := []string{"nftables sync", "nftables sync"}
	if atStart {
		wantLog = []string{"nftables sync", "retire all but nftables", "nftables sync"}
	}
	if strings.Join(log, "; ") != strings.Join(wantLog, "; ") || s.Mode() != proxy.ModeNFTables {
		t.Fatalf("refused annotation %q: calls %q, mode %s; want %q, nftables", mode, log, s.Mode(), wantLog)
	}
	if len(finished) != 1 || finished[0].Phase != statusapi.MigrationFailed {
		t.Fatalf("refused annotation %q: finished %+v, want one failed switch", mode, finished)
	}
	m := finished[0]
	if !strings.Contains(m.Error, proxy.AnnotationProxyMode) || !strings.Contains(m.Error, "nothing changed") {
		t.Fatalf("refused annotation %q: error %q does not name %s and say nothing changed", mode, m.Error, proxy.AnnotationProxyMode)
	}
	if ev := Event("n1", m, time.Unix(0, 0)); len(ev.Message) > maxEventMessage {
		t.Fatalf("refused annotation of %d bytes: Event message of %d bytes, want at most %d", len(mode), len(ev.Message), maxEventMessage)
	}
}

func fuzzMigrationAnnotation(t *testing.T, record string) {
	node := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{cluster.AnnotationMigration: record}}}
	rec, recErr := cluster.RecordOf(&node)
	if recErr != nil {
		if rec != nil || !strings.Contains(recErr.Error(), cluster.AnnotationMigration) || !strings.Contains(recErr.Error(), "n1") {
			t.Fatalf("record %q: %v, %v; want no record and an error naming the node and %s", record, rec, recErr, cluster.AnnotationMigration)
		}
	}
	if rec != nil && (rec.Kind != cluster.KindFromKubeProxy && rec.Kind != cluster.KindTo ||
		rec.Phase != cluster.PhaseRunning && rec.Phase != cluster.PhaseDone && rec.Phase != cluster.PhaseFailed && rec.Phase != cluster.PhaseRollingBack) {
		t.Fatalf("record %q read as kind %q, phase %q", record, rec.Kind, rec.Phase)
	}
	for _, req := range []cluster.Request{{To: "iptables"}, {FromKubeProxy: true}, {FromKubeProxy: true, Rollback: true}} {
		p, err := cluster.NewPlan(req, []v1.Node{node})
		if recErr != nil && (p != nil || err == nil) {
			t.Fatalf("record %q (%v): request %+v planned %+v, %v; want no plan", record, recErr, req, p, err)
		}
		if err != nil && !strings.Contains(err.Error(), "n1") {
			t.Fatalf("record %q: request %+v: error %q does not name the node", record, req, err)
		}
	}
}
