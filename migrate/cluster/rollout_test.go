package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func toIPTables() Request {
	return Request{To: "iptables", MaxUnavailable: 1, Pause: true, NodeTimeout: time.Minute}
}

func TestToModeSwitchesOneNodeAtATimeEachGatedOnItsKP(t *testing.T) {
	w := newWorld(t, "node-a", "node-b", "node-c")
	w.runsKP("nftables")
	if err := w.controller().Run(context.Background(), toIPTables()); err != nil {
		t.Fatalf("%v\n%s", err, w.out.String())
	}
	log := w.events()
	for i, n := range []string{"node-a", "node-b", "node-c"} {
		switched := index(log, n+": kp switch to iptables succeeded")
		if switched < 0 {
			t.Fatalf("%s never switched: %v", n, log)
		}
		if i < 2 {
			next := []string{"node-a", "node-b", "node-c"}[i+1]
			if annotated := index(log, next+`: patch {"metadata":{"annotations":{"kpproxy.io/proxy-mode":"iptables"}}}`); annotated < switched {
				t.Errorf("%s annotated (event %d) before %s's kp reported iptables (event %d):\n%s", next, annotated, n, switched, strings.Join(log, "\n"))
			}
		}
		r := w.record(n)
		if r == nil || r.Phase != PhaseDone || r.Previous != "nftables" || r.To != "iptables" {
			t.Errorf("%s: record %v, want done, previous nftables", n, r)
		}
	}
	if !strings.Contains(w.out.String(), "[done 3, in flight 0, left 0, failed 0]") {
		t.Errorf("progress does not end with 3 done:\n%s", w.out.String())
	}
}

func TestToModePausesAtTheFirstFailureAndResumesThere(t *testing.T) {
	w := newWorld(t, "node-a", "node-b", "node-c")
	w.runsKP("nftables")
	w.kp["node-b"].failTo = "iptables"
	err := w.controller().Run(context.Background(), toIPTables())
	var se *StepError
	if !errors.As(err, &se) || se.Node != "node-b" || se.Step != "switch" {
		t.Fatalf("want a StepError at node node-b, step switch; got %v\n%s", err, w.out.String())
	}
	if !strings.Contains(err.Error(), "node node-b: step switch: kp's switch to iptables failed at its program step") {
		t.Errorf("error does not name the node, the step and kp's reason: %v", err)
	}
	if r := w.record("node-b"); r == nil || r.Phase != PhaseFailed || r.Step != "switch" || r.Previous != "nftables" {
		t.Errorf("node-b's record after the failure: %v", r)
	}
	if n := w.node("node-c"); len(n.Annotations) != 0 {
		t.Errorf("node-c was touched after the pause at node-b: %v", n.Annotations)
	}
	if w.kp["node-c"].mode != "nftables" {
		t.Errorf("node-c's kp runs %s", w.kp["node-c"].mode)
	}

	// Fixed (kp restarted able to run iptables, as the annotation asks):
	// the same command resumes with node-b, skips node-a.
	w.mu.Lock()
	w.kp["node-b"] = &fakeKP{mode: "iptables", annotation: "iptables", lastSync: w.clock.Now()}
	w.mu.Unlock()
	before := len(w.events())
	w.out.Reset()
	if err := w.controller().Run(context.Background(), toIPTables()); err != nil {
		t.Fatalf("resume: %v\n%s", err, w.out.String())
	}
	plan := w.out.String()
	if !strings.Contains(plan, "1. node-b") || !strings.Contains(plan, "resume: failed at step switch") ||
		!strings.Contains(plan, "node-a                   skip      done") {
		t.Errorf("resume plan: want node-b first (resumed), node-a skipped:\n%s", plan)
	}
	for _, l := range w.events()[before:] {
		if strings.HasPrefix(l, "node-a:") {
			t.Errorf("the resumed rollout touched node-a again: %s", l)
		}
	}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if r := w.record(n); r == nil || r.Phase != PhaseDone || r.Previous != "nftables" {
			t.Errorf("%s after the resume: record %v", n, r)
		}
	}
}

func TestWithoutPauseTheOtherNodesGoOn(t *testing.T) {
	w := newWorld(t, "node-a", "node-b", "node-c")
	w.runsKP("nftables")
	w.kp["node-a"].failTo = "iptables"
	req := toIPTables()
	req.Pause = false
	if err := w.controller().Run(context.Background(), req); err == nil || !strings.Contains(err.Error(), "node node-a") {
		t.Fatalf("want node-a's failure, got %v", err)
	}
	for _, n := range []string{"node-b", "node-c"} {
		if w.kp[n].mode != "iptables" {
			t.Errorf("%s runs %s, want iptables: --pause=false goes on", n, w.kp[n].mode)
		}
	}
}

func TestMaxUnavailableRunsThatManyNodesAtOnce(t *testing.T) {
	w := newWorld(t, "node-a", "node-b", "node-c", "node-d")
	w.runsKP("nftables")
	req := toIPTables()
	req.MaxUnavailable = 2
	if err := w.controller().Run(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	// Each node's step waits on its kp; with two slots, never three in
	// flight.
	if strings.Contains(w.out.String(), "in flight 3") {
		t.Errorf("3 nodes in flight with --max-unavailable 2:\n%s", w.out.String())
	}
	for _, n := range []string{"node-a", "node-b", "node-c", "node-d"} {
		if w.kp[n].mode != "iptables" {
			t.Errorf("%s runs %s", n, w.kp[n].mode)
		}
	}
}

func TestToModeRollbackReturnsEachNodeToItsPreviousModeLastFirst(t *testing.T) {
	w := newWorld(t, "node-a", "node-b", "node-c")
	w.runsKP("nftables")
	w.kp["node-c"].failTo = "iptables"
	if err := w.controller().Run(context.Background(), toIPTables()); err == nil {
		t.Fatal("want node-c to fail")
	}
	req := toIPTables()
	req.Rollback = true
	if err := w.controller().Run(context.Background(), req); err != nil {
		t.Fatalf("%v\n%s", err, w.out.String())
	}
	log := w.events()
	b, a := index(log, "node-b: kp switch to nftables succeeded"), index(log, "node-a: kp switch to nftables succeeded")
	if b < 0 || a < 0 || b > a {
		t.Errorf("rollback order: want node-b (event %d) before node-a (event %d):\n%s", b, a, strings.Join(log, "\n"))
	}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if w.kp[n].mode != "nftables" {
			t.Errorf("%s runs %s after the rollback", n, w.kp[n].mode)
		}
		if a := w.node(n).Annotations; len(a) != 0 {
			t.Errorf("%s keeps annotations after the rollback: %v", n, a)
		}
	}
}

func TestJSONOutputIsThePlanThenEveryNodesProgressThenTheSummary(t *testing.T) {
	w := newWorld(t, "node-a", "node-b")
	w.runsKP("nftables")
	c := w.controller()
	c.cfg.JSON = true
	if err := c.Run(context.Background(), toIPTables()); err != nil {
		t.Fatalf("%v\n%s", err, w.out.String())
	}
	var events []Event
	for _, line := range strings.Split(strings.TrimSpace(w.out.String()), "\n") {
		var e Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("not one JSON object a line: %q: %v\n%s", line, err, w.out.String())
		}
		events = append(events, e)
	}
	first, last := events[0], events[len(events)-1]
	if first.Type != "plan" || first.Plan == nil || first.Plan.Kind != "to" || first.Plan.To != "iptables" ||
		len(first.Plan.Nodes) != 2 || first.Plan.Nodes[0] != (NodePlanJSON{Node: "node-a", Action: ActionMigrate, Reason: "not started"}) {
		t.Errorf("first event: %+v %+v, want the plan", first, first.Plan)
	}
	if last.Type != "summary" || last.Counts == nil || *last.Counts != (Counts{Done: 2}) {
		t.Errorf("last event: %+v %+v, want the summary of 2 done", last, last.Counts)
	}
	var states []string
	for _, e := range events[1 : len(events)-1] {
		if e.Type != "progress" || e.Time.IsZero() || e.Counts == nil {
			t.Errorf("event %+v: want progress, with a time and the counts", e)
		}
		if e.Node == "node-a" {
			states = append(states, strings.TrimSpace(e.State+" "+e.Step))
		}
	}
	if len(states) < 3 || states[0] != "started" || !strings.HasPrefix(states[1], "step ") || states[len(states)-1] != "done" {
		t.Errorf("node-a's progress: %q, want started, its steps, done", states)
	}
}
