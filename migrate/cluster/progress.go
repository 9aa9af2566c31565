package cluster

import (
	"fmt"
	"io"
	"sync"

	"k8s.io/utils/clock"
)

// progress prints the rollout as lines: each node's state changes and
// steps, with the counts of nodes done, in flight and left.
type progress struct {
	w   io.Writer
	clk clock.PassiveClock

	mu                   sync.Mutex
	done, failed, flight int
	left                 int
	skipped              int
}

func newProgress(w io.Writer, clk clock.PassiveClock, skipped int, todo []NodePlan) *progress {
	return &progress{w: w, clk: clk, left: len(todo), skipped: skipped}
}

func (p *progress) line(node, state, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.linef(node, state, detail)
}

// linef prints with p.mu held.
func (p *progress) linef(node, state, detail string) {
	fmt.Fprintf(p.w, "%s  [done %d, in flight %d, left %d, failed %d]  %-16s %-12s %s\n",
		p.clk.Now().Format("15:04:05"), p.done, p.flight, p.left, p.failed, node, state, detail)
}

func (p *progress) start(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.left--
	p.flight++
	p.linef(node, "started", "")
}

// step reports a node's step as it ends.
func (p *progress) step(node, step, detail string) { p.line(node, "step "+step, detail) }

func (p *progress) end(node string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flight--
	if err != nil {
		p.failed++
		p.linef(node, "FAILED", err.Error())
		return
	}
	p.done++
	p.linef(node, "done", "")
}

func (p *progress) summary() {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%d node(s) done, %d failed, %d not started, %d skipped (done before or not concerned)\n",
		p.done, p.failed, p.left, p.skipped)
}
