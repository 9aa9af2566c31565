package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/kpproxy/kp/internal/kubeclient"
)

// Config configures a Controller.
type Config struct {
	Client kubeclient.Interface
	// KP reads a kp pod's status and inventory (PodExec).
	KP KPReader
	// Namespace of both DaemonSets (kube-system), and their names.
	Namespace          string
	KPDaemonSet        string
	KubeProxyDaemonSet string
	// Out receives the plan and the progress lines; nil discards. JSON
	// writes them as JSON Lines, one Event each.
	Out  io.Writer
	JSON bool
	Log  *slog.Logger
	// Clock and PollInterval pace the gates (tests use a fake clock).
	Clock        clock.Clock
	PollInterval time.Duration
}

// Controller carries out Requests.
type Controller struct {
	cfg      Config
	progress *progress
}

// New returns a Controller with cfg's defaults filled in.
func New(cfg Config) *Controller {
	if cfg.Namespace == "" {
		cfg.Namespace = metav1.NamespaceSystem
	}
	if cfg.KPDaemonSet == "" {
		cfg.KPDaemonSet = "kp"
	}
	if cfg.KubeProxyDaemonSet == "" {
		cfg.KubeProxyDaemonSet = "kube-proxy"
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	return &Controller{cfg: cfg}
}

// StepError is a node's failure: the node, the step, what went wrong.
type StepError struct {
	Node, Step string
	Err        error
}

func (e *StepError) Error() string { return fmt.Sprintf("node %s: step %s: %v", e.Node, e.Step, e.Err) }
func (e *StepError) Unwrap() error { return e.Err }

// Run plans req from the Nodes, prints the plan, and carries it out.
func (c *Controller) Run(ctx context.Context, req Request) error {
	if req.NodeTimeout <= 0 {
		req.NodeTimeout = 5 * time.Minute
	}
	plan, err := c.plan(ctx, req)
	if err != nil {
		return err
	}
	todo := plan.Todo()
	c.progress = newProgress(c.cfg.Out, c.cfg.Clock, c.cfg.JSON, len(plan.Nodes)-len(todo), todo)
	if req.FromKubeProxy {
		if err := c.prepareFromKubeProxy(ctx, req, plan); err != nil {
			return err
		}
	}
	if err := c.rollout(ctx, req, plan); err != nil {
		return err
	}
	if req.FromKubeProxy && !req.Rollback {
		return c.finishFromKubeProxy(ctx, req)
	}
	return nil
}

// rollout runs each node of plan's to-do list, at most MaxUnavailable at
// once. With Pause, the first failure stops new nodes from starting; the
// ones in flight finish.
func (c *Controller) rollout(ctx context.Context, req Request, plan *Plan) error {
	todo := plan.Todo()
	sem := make(chan struct{}, req.MaxUnavailable)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		errs    []error
		stopped bool
	)
	for _, n := range todo {
		sem <- struct{}{}
		mu.Lock()
		stop := stopped
		mu.Unlock()
		if stop || ctx.Err() != nil {
			<-sem
			break
		}
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			defer func() { <-sem }()
			c.progress.start(node)
			err := c.node(ctx, req, node)
			c.progress.end(node, err)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				stopped = stopped || req.Pause
				mu.Unlock()
			}
		}(n.Node)
	}
	wg.Wait()
	c.progress.summary()
	if len(errs) > 0 {
		if req.Pause {
			return fmt.Errorf("paused: %w (fix it and re-run the same command to resume, or add --rollback)", errors.Join(errs...))
		}
		return errors.Join(errs...)
	}
	return ctx.Err()
}

// node carries out req on one node.
func (c *Controller) node(ctx context.Context, req Request, node string) error {
	switch {
	case req.FromKubeProxy && req.Rollback:
		return c.handBack(ctx, req, node)
	case req.FromKubeProxy:
		return c.takeOver(ctx, req, node)
	case req.Rollback:
		return c.switchBack(ctx, req, node)
	default:
		return c.switchMode(ctx, req, node)
	}
}

// PrintPlan prints what Run would do for req, changing nothing.
func (c *Controller) PrintPlan(ctx context.Context, req Request) error {
	if _, err := c.plan(ctx, req); err != nil {
		return err
	}
	c.message("Dry run: nothing changed.")
	return nil
}

// plan validates req, plans it from the Nodes and prints the plan.
func (c *Controller) plan(ctx context.Context, req Request) (*Plan, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	nodes, err := c.cfg.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	plan, err := NewPlan(req, nodes.Items)
	if err != nil {
		return nil, err
	}
	if c.cfg.JSON {
		writeEvent(c.cfg.Out, Event{Type: "plan", Time: c.cfg.Clock.Now(), Plan: plan.JSON()})
	} else {
		plan.Print(c.cfg.Out)
	}
	return plan, nil
}

// message tells what the command did beside the nodes' steps: a line of
// text, or a message Event.
func (c *Controller) message(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if c.cfg.JSON {
		writeEvent(c.cfg.Out, Event{Type: "message", Time: c.cfg.Clock.Now(), Message: msg})
		return
	}
	fmt.Fprintln(c.cfg.Out, msg)
}
