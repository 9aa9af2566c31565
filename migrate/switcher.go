package migrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// SwitcherConfig configures a Switcher.
type SwitcherConfig struct {
	// Initial is the backend kp started with (probed), running as
	// InitialTarget (its iptables flavor resolved).
	Initial       proxy.Backend
	InitialTarget proxy.Target
	// Build builds and probes a target's backend and returns the target
	// resolved (the iptables flavor it chose).
	Build func(ctx context.Context, t proxy.Target) (proxy.Backend, proxy.Target, error)
	// Retire removes what else programs the node's Services besides the
	// running target's rules: kp's other modes and upstream kube-proxy's
	// leftovers. It runs after the first successful sync and after every
	// switch. With keepActive, it keeps the old mode's state that still
	// carries established connections (IPVS virtual servers) and returns
	// how much it kept; the Switcher runs it again at later syncs.
	Retire func(ctx context.Context, running proxy.Target, st *proxy.State, keepActive bool) (kept int, err error)
	// Verify proves that b carries every Service of st; nil is
	// VerifyServices with real sockets.
	Verify func(ctx context.Context, st *proxy.State, b proxy.Backend) (*statusapi.Verification, error)
	// Switched is told when backend b replaces old (what follows the
	// mode, such as the conntrack cleaner, adapts; old may still drain).
	Switched func(old, b proxy.Backend)
	// Finished is told the outcome of every switch asked for (kp records
	// it as an Event on its Node).
	Finished func(m statusapi.Migration)
	// AllowModeNone lets the Node annotation ask for proxy.ModeNone
	// (--allow-mode-none); without it such a request is refused, recorded
	// as a failed switch (Finished: an Event on the Node), and nothing
	// changes.
	AllowModeNone bool
	// Drain bounds how long an old mode that proxies connections itself
	// (userspace) keeps serving its open connections after a switch, and
	// how long Retire keeps state for established connections.
	Drain time.Duration
	Log   *slog.Logger
	Clock clock.PassiveClock
}

// Switcher is the Backend kp proxy runs: it forwards every sync to the
// current mode's backend and switches modes inside the sync loop when
// asked (Request, from the status API; or the Node's kpproxy.io/proxy-mode
// annotation), so no sync races a switch and the sources and State stay
// the same. A switch programs the target mode fully while the old one
// still serves, proves the new path with VerifyServices, and only then
// makes it current and removes the old mode's rules (Retire). If
// programming or verifying fails, the new mode's rules are removed and the
// old mode keeps serving.
type Switcher struct {
	cfg     SwitcherConfig
	trigger func()

	mu        sync.Mutex
	cur       proxy.Backend
	curTarget proxy.Target
	synced    bool
	// failed: the last sync of the current backend failed; full: for a
	// backend that cannot say (FullSyncReporter), whether its last sync
	// counts as full, by the sync loop's own rule: the first, and the one
	// after a failure.
	failed, full bool
	// annotation is the last kpproxy.io/proxy-mode value acted on.
	annotation string
	pending    *switchRequest
	progress   *statusapi.Migration
	nextID     uint64
	// keepUntil ends the drain bound of the last change of mode; kept is
	// what the last Retire kept for connections, looked at again from
	// nextRetire (switcher_retire.go).
	keepUntil  time.Time
	kept       int
	nextRetire time.Time
	// swapped is closed when another backend becomes current (and
	// replaced): the running mode's drift detector stops with its mode.
	swapped chan struct{}
}

type switchRequest struct {
	id       uint64
	target   proxy.Target
	by       string
	progress *statusapi.Migration
}

// NewSwitcher returns a Switcher running cfg.Initial.
func NewSwitcher(cfg SwitcherConfig) *Switcher {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Verify == nil {
		cfg.Verify = func(ctx context.Context, st *proxy.State, b proxy.Backend) (*statusapi.Verification, error) {
			return VerifyServices(ctx, st, b, VerifyOptions{})
		}
	}
	return &Switcher{cfg: cfg, cur: cfg.Initial, curTarget: cfg.InitialTarget, swapped: make(chan struct{})}
}

// SetTrigger gives the Switcher the sync runner's Trigger, so a request
// runs at the next sync rather than at the periodic one.
func (s *Switcher) SetTrigger(f func()) { s.mu.Lock(); s.trigger = f; s.mu.Unlock() }

// Request asks for a switch to t at the next sync and returns its
// progress record. Asking for the mode that runs re-verifies it and runs
// Retire again (kube-proxy's rules re-created by a kube-proxy that was
// still running, an interrupted switch's leftovers). A request while
// another switch is pending or running is refused, naming that one.
func (s *Switcher) Request(t proxy.Target, by string) (*statusapi.Migration, error) {
	s.mu.Lock()
	if s.curTarget.Mode == proxy.ModeIPTables && t.Mode == proxy.ModeIPTables && t.IPTablesBackend != "" &&
		t.IPTablesBackend != s.curTarget.IPTablesBackend {
		s.mu.Unlock()
		return nil, fmt.Errorf("from %s to %s: kp cannot run both iptables flavors at once; switch to nftables first", s.curTarget, t)
	}
	if err := s.underWay(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.request(t, by)
	trigger := s.trigger
	s.mu.Unlock()
	if trigger != nil {
		trigger()
	}
	return s.Migration(), nil
}

// request records a pending switch; s.mu is held.
func (s *Switcher) request(t proxy.Target, by string) {
	s.nextID++
	s.progress = &statusapi.Migration{ID: s.nextID, From: s.curTarget.String(), To: t.String(), RequestedBy: by,
		Phase: statusapi.MigrationPending}
	s.pending = &switchRequest{id: s.nextID, target: t, by: by, progress: s.progress}
}

// noteAnnotation turns a new value of the Node's kpproxy.io/proxy-mode
// annotation into a request. A value it refuses (not a mode; none without
// AllowModeNone) changes nothing and is recorded as a failed switch, which
// it returns for Finished.
func (s *Switcher) noteAnnotation(st *proxy.State) *statusapi.Migration {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := st.Node.ProxyMode
	if a == s.annotation {
		return nil
	}
	s.annotation = a
	if a == "" {
		return nil
	}
	by := fmt.Sprintf("annotation %s on Node %s", proxy.AnnotationProxyMode, st.Node.Name)
	t, err := proxy.ParseTarget(a)
	to := t.String()
	if err != nil {
		// Anyone who may patch the Node writes the value: it goes into
		// the status, the log and the Event quoted and cut short.
		to = proxy.QuoteBounded(a)
		err = fmt.Errorf("annotation %s: %w; nothing changed", proxy.AnnotationProxyMode, err)
	} else if t.Mode == proxy.ModeNone && !s.cfg.AllowModeNone {
		err = errors.New("annotation " + proxy.AnnotationProxyMode + "=none: mode none removes kp's rules and leaves " +
			"the node's Services to another proxy, and this kp runs without --allow-mode-none, so it refuses (kp " +
			"migrate cluster --rollback needs kp started with --allow-mode-none); nothing changed")
	}
	if err != nil {
		s.nextID++
		now := s.cfg.Clock.Now()
		s.progress = &statusapi.Migration{ID: s.nextID, From: s.curTarget.String(), To: to, RequestedBy: by,
			Phase: statusapi.MigrationFailed, Error: err.Error(), Started: now, Ended: now}
		s.cfg.Log.Error("ignoring the Node's proxy mode annotation", "node", st.Node.Name, "annotation", proxy.AnnotationProxyMode, "err", err)
		m := *s.progress
		return &m
	}
	// At start, an annotation naming the mode kp already runs is no
	// request; later, any new value is one.
	if !s.synced && s.curTarget.Satisfies(t) {
		return nil
	}
	s.request(t, by)
	return nil
}

func (s *Switcher) nextRequest() *switchRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.pending
	s.pending = nil
	return r
}

// Sync syncs the current backend, then carries out a pending switch.
func (s *Switcher) Sync(ctx context.Context, st *proxy.State) error {
	if refused := s.noteAnnotation(st); refused != nil && s.cfg.Finished != nil {
		s.cfg.Finished(*refused)
	}
	req := s.nextRequest()
	s.mu.Lock()
	first := !s.synced
	s.mu.Unlock()
	if first {
		return s.firstSync(ctx, st, req)
	}
	cur, _ := s.Current()
	err := cur.Sync(ctx, st)
	s.noteSync(false, err)
	if err != nil {
		s.requeue(req)
		return err
	}
	if req != nil {
		s.migrate(ctx, st, req)
	} else {
		s.retireKept(ctx, st)
	}
	return nil
}

// requeue keeps a request for the next sync after the current mode's sync
// failed, unless a newer one came meanwhile.
func (s *Switcher) requeue(req *switchRequest) {
	if req == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		s.pending = req
	}
}

// firstSync starts in the requested mode rather than the configured one
// when a request (the Node's annotation) is there at start: nothing has
// synced yet, so there is nothing to hand over, and Retire removes the
// rules a previous kp left in the configured mode.
func (s *Switcher) firstSync(ctx context.Context, st *proxy.State, req *switchRequest) error {
	cur, curT := s.Current()
	var p *statusapi.Migration
	if req != nil {
		p = s.begin(req)
	}
	if req != nil && !curT.Satisfies(req.target) {
		end := s.step(p, "program")
		b, t, err := s.cfg.Build(ctx, req.target)
		if err != nil {
			end("", err)
			s.finish(p, fmt.Errorf("start in %s: %w; staying in %s", req.target, err, curT))
		} else {
			end(fmt.Sprintf("started in %s instead of the configured %s", t, curT), nil)
			s.cfg.Log.Info("starting in the requested mode, not the configured one", "mode", t.String(),
				"configured", curT.String(), "requestedBy", req.by)
			s.swap(b, t)
			cur, curT = b, t
		}
	}
	err := cur.Sync(ctx, st)
	s.noteSync(true, err)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	s.startDrain()
	err = s.retire(ctx, curT, st)
	if err != nil {
		s.cfg.Log.Warn("removing the leftovers of other proxies failed; they may still match packets", "err", err)
	}
	if req != nil && s.running(p) {
		end := s.step(p, "remove")
		end("removed other modes' and kube-proxy's rules"+s.keptForConnectionsNote(), err)
		s.finish(p, err)
	}
	return nil
}

// migrate switches to req's target (or, for the running target,
// re-verifies it and removes every other proxy's rules).
func (s *Switcher) migrate(ctx context.Context, st *proxy.State, req *switchRequest) {
	old, oldT := s.Current()
	p := s.begin(req)
	log := s.cfg.Log.With("from", oldT.String(), "to", req.target.String(), "requestedBy", req.by)
	log.Info("migration started")
	nb, nt := old, oldT
	same := oldT.Satisfies(req.target)
	end := s.step(p, "program")
	if same {
		end("already running "+oldT.String()+"; nothing to program", nil)
	} else {
		b, t, err := s.cfg.Build(ctx, req.target)
		if err == nil {
			err = b.Sync(ctx, st)
			if err != nil {
				s.abandon(ctx, b, log)
			}
		}
		if err != nil {
			end("", err)
			s.finish(p, fmt.Errorf("program %s: %w; %s keeps serving", req.target, err, oldT))
			return
		}
		nb, nt = b, t
		end(fmt.Sprintf("%s programmed %d service ports while %s serves", nt, len(st.Services), oldT), nil)
		log.Info("migration: new mode programmed", "servicePorts", len(st.Services))
	}

	end = s.step(p, "verify")
	v, err := s.verify(ctx, st, nb, nt, p)
	if err != nil && same && v != nil {
		// kp's mode runs and synced without error, yet its counters did
		// not move: another proxy's rules written after kp's (a
		// kube-proxy that was still running re-created them) come first
		// in the same nat hooks and take the new connections. Remove
		// them, then prove kp's path again.
		end(fmt.Sprintf("not proven yet, rules written after kp's come first in the nat hooks: %v", err), nil)
		log.Warn("migration: kp's rules are shadowed by rules written after them; removing those and verifying again", "err", err)
		end = s.step(p, "remove")
		rerr := s.retire(ctx, nt, st)
		end("removed the rules that came first (kp's other modes, kube-proxy's)", rerr)
		end = s.step(p, "verify")
		v, err = s.verify(ctx, st, nb, nt, p)
	}
	if err != nil && !same && shadowed(v) && s.oldTakesTheProbes(ctx, st, old) {
		end(fmt.Sprintf("not proven yet, %s's rules come first in the nat hooks and took the probes: %v", oldT, err), nil)
		log.Warn("migration: the new mode's rules are shadowed by the old mode's; removing those first", "err", err)
		s.handOverShadowed(ctx, st, &migrationRecord{progress: p, old: old, nb: nb, oldT: oldT, nt: nt}, log)
		return
	}
	if err != nil {
		end("", err)
		if !same {
			s.abandon(ctx, nb, log)
			err = fmt.Errorf("%w; %s's rules removed, %s keeps serving", err, nt, oldT)
		}
		s.finish(p, fmt.Errorf("verify %s: %w", nt, err))
		return
	}
	end(fmt.Sprintf("%d service ports proven by %s's counters (%s)", v.ServicePorts, nt, v.Summary()), nil)
	log.Info("migration: new path verified", "servicePorts", v.ServicePorts, "probes", v.Probes, "addresses", v.Addresses, "skipped", len(v.Skipped))

	if !same {
		s.swap(nb, nt)
		s.startDrain()
	}
	end = s.step(p, "remove")
	err = s.retire(ctx, nt, st)
	if !same {
		s.drain(old, log)
	}
	end(fmt.Sprintf("removed every rule but %s's (kp's other modes, kube-proxy's)%s", nt, s.keptForConnectionsNote()), err)
	if err != nil {
		err = fmt.Errorf("remove the old rules: %w (%s serves; re-run to retry)", err, nt)
	}
	s.finish(p, err)
}

// verify runs Verify and records its report; service ports it could not
// prove are an error.
func (s *Switcher) verify(ctx context.Context, st *proxy.State, b proxy.Backend, t proxy.Target, p *statusapi.Migration) (*statusapi.Verification, error) {
	v, err := s.cfg.Verify(ctx, st, b)
	if err == nil && len(v.Failed) > 0 {
		err = fmt.Errorf("%d addresses not carried by %s: %s", len(v.Failed), t, v.Failed[0])
	}
	s.mu.Lock()
	p.Verification = v
	s.mu.Unlock()
	return v, err
}

func (s *Switcher) swap(b proxy.Backend, t proxy.Target) {
	s.mu.Lock()
	old := s.cur
	s.cur, s.curTarget = b, t
	close(s.swapped)
	s.swapped = make(chan struct{})
	s.mu.Unlock()
	if s.cfg.Switched != nil {
		s.cfg.Switched(old, b)
	}
}

var (
	_ proxy.Backend        = (*Switcher)(nil)
	_ proxy.NodePortScoper = (*Switcher)(nil)
	_ proxy.DriftDetector  = (*Switcher)(nil)
	_ proxy.RuleLister     = (*Switcher)(nil)
)

// SetFinished sets SwitcherConfig.Finished (kp knows its API client only
// once its sources are built).
func (s *Switcher) SetFinished(f func(m statusapi.Migration)) { s.cfg.Finished = f }
