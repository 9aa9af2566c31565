package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// progress prints the rollout as lines: each node's state changes and
// steps, with the counts of nodes done, in flight and left; as JSON Lines
// (Config.JSON) one Event each.
type progress struct {
	w    io.Writer
	clk  clock.PassiveClock
	json bool

	mu                   sync.Mutex
	done, failed, flight int
	left                 int
	skipped              int
}

// Event is one line of kp migrate cluster -o json. Type says which kind
// and so which fields are set: "plan" (Plan: the request and every node's
// action, in order), "message" (Message: what the command did beside the
// nodes' steps, such as labeling them or patching a DaemonSet),
// "progress" (a node's state: started, step with Step, waiting, retake,
// done or failed, a Detail, and the counts after it), "summary" (the
// counts at the end). The names are kept stable for scripts.
type Event struct {
	Type    string    `json:"type"`
	Time    time.Time `json:"time"`
	Plan    *PlanJSON `json:"plan,omitempty"`
	Message string    `json:"message,omitempty"`
	Node    string    `json:"node,omitempty"`
	State   string    `json:"state,omitempty"`
	Step    string    `json:"step,omitempty"`
	Detail  string    `json:"detail,omitempty"`
	Counts  *Counts   `json:"counts,omitempty"`
}

// Counts are the rollout's nodes by state.
type Counts struct {
	Done     int `json:"done"`
	InFlight int `json:"inFlight"`
	Left     int `json:"left"`
	Failed   int `json:"failed"`
	// Skipped (summary only): done before, or not concerned.
	Skipped int `json:"skipped"`
}

func newProgress(w io.Writer, clk clock.PassiveClock, asJSON bool, skipped int, todo []NodePlan) *progress {
	return &progress{w: w, clk: clk, json: asJSON, left: len(todo), skipped: skipped}
}

// writeEvent writes e as one JSON line.
func writeEvent(w io.Writer, e Event) {
	b, err := json.Marshal(e)
	if err != nil {
		b, _ = json.Marshal(Event{Type: "message", Time: e.Time, Message: "encoding an event: " + err.Error()})
	}
	_, _ = w.Write(append(b, '\n'))
}

func (p *progress) line(node, state, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.linef(node, state, "", detail)
}

// linef prints with p.mu held.
func (p *progress) linef(node, state, step, detail string) {
	if p.json {
		writeEvent(p.w, Event{Type: "progress", Time: p.clk.Now(), Node: node, State: state, Step: step, Detail: detail,
			Counts: &Counts{Done: p.done, InFlight: p.flight, Left: p.left, Failed: p.failed}})
		return
	}
	if step != "" {
		state += " " + step
	}
	if state == "failed" {
		state = "FAILED"
	}
	fmt.Fprintf(p.w, "%s  [done %d, in flight %d, left %d, failed %d]  %-16s %-12s %s\n",
		p.clk.Now().Format("15:04:05"), p.done, p.flight, p.left, p.failed, node, state, detail)
}

func (p *progress) start(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.left--
	p.flight++
	p.linef(node, "started", "", "")
}

// waiting reports what a node's step waits for, when that changes.
func (p *progress) waiting(node, step, pending string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		p.linef(node, "waiting", step, pending)
		return
	}
	p.linef(node, "waiting", "", step+": "+pending)
}

// step reports a node's step as it ends.
func (p *progress) step(node, step, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.linef(node, "step", step, detail)
}

func (p *progress) end(node string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flight--
	if err != nil {
		p.failed++
		p.linef(node, "failed", "", err.Error())
		return
	}
	p.done++
	p.linef(node, "done", "", "")
}

func (p *progress) summary() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		writeEvent(p.w, Event{Type: "summary", Time: p.clk.Now(), Counts: &Counts{Done: p.done, Left: p.left, Failed: p.failed, Skipped: p.skipped}})
		return
	}
	fmt.Fprintf(p.w, "%d node(s) done, %d failed, %d not started, %d skipped (done before or not concerned)\n",
		p.done, p.failed, p.left, p.skipped)
}
