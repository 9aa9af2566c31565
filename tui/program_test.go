package tui

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/teatest/v2"

	"github.com/kpproxy/kp/conntrack"
)

// These run the whole program, as the terminal would, with teatest: reads
// through a Source, conntrack events through the channel Run feeds.

func waitScreen(t *testing.T, tm *teatest.TestModel, want ...string) {
	t.Helper()
	var seen []byte
	teatest.WaitFor(t, tm.Output(), func(b []byte) bool {
		seen = append(seen, b...)
		s := ansi.Strip(string(seen))
		for _, w := range want {
			if !strings.Contains(s, w) {
				return false
			}
		}
		return true
	}, teatest.WithDuration(10*time.Second), teatest.WithCheckInterval(20*time.Millisecond))
}

func TestProgramDrillsDownAndStreamsFlows(t *testing.T) {
	src := &fakeSource{svcs: services(1, 2, 3), flows: flows()[:1]}
	events := make(chan tea.Msg)
	m := New(Config{Source: src, Refresh: time.Hour, Events: events, Now: func() time.Time { return t0 }})
	tm := teatest.NewTestModel(t, m, teatest.WithInitialTermSize(100, 24))

	// The renderer only redraws what changed, so the output is searched
	// for text that first appears whole.
	waitScreen(t, tm, "default/web:http", "kube-system/dns:dns")
	tm.Send(keyMsg("enter"))
	waitScreen(t, tm, "LAST INTERVAL", "10.244.3.4:40001")

	// Two batches of events on an unbuffered channel: the second send
	// completes only if the model listened again after the first.
	sent := make(chan struct{})
	go func() {
		events <- flowEventsMsg{{Type: conntrack.EventNew, Flow: flows()[1]}}
		events <- flowEventsMsg{{Type: conntrack.EventNew, Flow: flows()[2]}}
		close(sent)
	}()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the model stopped listening to the event stream")
	}

	tm.Send(keyMsg("esc"))
	tm.Type(":flows")
	tm.Send(keyMsg("enter"))
	tm.Type("q")
	tm.WaitFinished(t, teatest.WithFinalTimeout(5*time.Second))
	final := tm.FinalModel(t).(*Model)
	if got := final.current().name(); got != "flows" {
		t.Errorf("final page %q, want flows", got)
	}
	s := screen(final)
	for _, want := range []string{"10.244.3.4:40001", "10.244.3.4:40002", "192.168.0.9:5000"} {
		if !strings.Contains(s, want) {
			t.Errorf("the flows view lacks %s, which came as an event:\n%s", want, s)
		}
	}
	if src.reads != 1 {
		t.Errorf("%d reads with a refresh of an hour, want 1", src.reads)
	}
}

func TestColourOnlyWhenAllowed(t *testing.T) {
	for _, color := range []bool{true, false} {
		t.Run(fmt.Sprintf("color=%v", color), func(t *testing.T) {
			m := New(Config{Source: &fakeSource{svcs: services(1, 2, 3)}, Refresh: time.Hour, Color: color})
			// A terminal that could show any colour: only the styles decide.
			tm := teatest.NewTestModel(t, m, teatest.WithInitialTermSize(100, 24),
				teatest.WithProgramOptions(tea.WithColorProfile(colorprofile.TrueColor)))
			var out bytes.Buffer
			teatest.WaitFor(t, tm.Output(), func(b []byte) bool {
				out.Write(b)
				return strings.Contains(ansi.Strip(out.String()), "kube-system/dns:dns")
			}, teatest.WithDuration(10*time.Second))
			tm.Type("q")
			tm.WaitFinished(t, teatest.WithFinalTimeout(5*time.Second))
			if colour := sgrColour.FindString(out.String()); (colour != "") != color {
				t.Errorf("colour sequence %q in the output", colour)
			}
		})
	}
}

// A terminal that reports no size (kubectl exec -it's pseudo-terminal
// before the runtime applies the client's) is drawn at 80×24, not as
// nothing.
func TestProgramOnATerminalOfNoSize(t *testing.T) {
	src := &fakeSource{svcs: services(1, 2, 3)}
	m := New(Config{Source: src, Refresh: time.Hour, Now: func() time.Time { return t0 }})
	tm := teatest.NewTestModel(t, m, teatest.WithInitialTermSize(0, 0))
	waitScreen(t, tm, "default/web:http", "kube-system/dns:dns")
	tm.Type("q")
	tm.WaitFinished(t, teatest.WithFinalTimeout(5*time.Second))
	final := tm.FinalModel(t).(*Model)
	if final.c.Width != 80 || final.c.Height != 24 {
		t.Errorf("size %d×%d after a 0×0 terminal, want 80×24", final.c.Width, final.c.Height)
	}
}
