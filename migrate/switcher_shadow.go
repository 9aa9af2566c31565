package migrate

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// The old mode shadows the new one when both sit in the same nat hooks at
// the same priority and the old mode's base chains run first: the kernel
// runs the newest of equal-priority chains first, so iptables-nft's nat
// chains that kubelet or a CNI plugin made before kp's nftables table ran
// (the case on a real node) come after kp's nftables DNAT, and a switch
// from nftables to iptables-nft sees its own counters stand still while
// the old mode takes every probe.

// shadowed reports whether a verification looks like shadowing: not one
// service port proven. A hook order decides for every Service at once; a
// new mode that carries some Services and not others is broken, not
// shadowed, and its switch fails as usual.
func shadowed(v *statusapi.Verification) bool {
	return v != nil && v.ServicePorts == 0 && len(v.Failed) > 0
}

// oldTakesTheProbes reports whether the old mode, not the new one, carries
// every Service now: its own counters move for every probed service port.
func (s *Switcher) oldTakesTheProbes(ctx context.Context, st *proxy.State, old proxy.Backend) bool {
	v, err := s.cfg.Verify(ctx, st, old)
	return err == nil && v != nil && len(v.Failed) == 0 && v.ServicePorts > 0
}

// handOverShadowed finishes a switch whose new mode synced but is shadowed
// by the old one: it makes the new mode current and removes the old one
// first, then proves the new path. If that proof fails, it programs the
// old mode again (a fresh backend, fully synced) and removes the new
// one's rules. Only a new mode that synced yet carries nothing would leave
// a window without rules, from the removal to the old mode's new sync.
func (s *Switcher) handOverShadowed(ctx context.Context, st *proxy.State, p *migrationRecord, log *slog.Logger) {
	s.swap(p.nb, p.nt)
	s.startDrain()
	end := s.step(p.progress, "remove")
	rerr := s.retire(ctx, p.nt, st)
	end(fmt.Sprintf("removed %s's rules first, as they came first in the nat hooks (kp's other modes, kube-proxy's)%s",
		p.oldT, s.keptForConnectionsNote()), rerr)
	end = s.step(p.progress, "verify")
	v, err := s.verify(ctx, st, p.nb, p.nt, p.progress)
	if err == nil {
		end(fmt.Sprintf("%d service ports proven by %s's counters (%s)", v.ServicePorts, p.nt, v.Summary()), nil)
		log.Info("migration: new path verified once the old mode's rules were gone", "servicePorts", v.ServicePorts)
		s.drain(p.old, log)
		if rerr != nil {
			rerr = fmt.Errorf("remove the old rules: %w (%s serves; re-run to retry)", rerr, p.nt)
		}
		s.finish(p.progress, rerr)
		return
	}
	end("", err)
	log.Error("migration: the new mode does not carry the Services; programming the old mode again", "err", err)
	ob, ot, berr := s.cfg.Build(ctx, p.oldT)
	if berr == nil {
		berr = ob.Sync(ctx, st)
	}
	if berr != nil {
		s.finish(p.progress, fmt.Errorf("verify %s: %w; programming %s again failed: %v; %s stays current", p.nt, err, p.oldT, berr, p.nt))
		return
	}
	s.swap(ob, ot)
	s.abandon(ctx, p.nb, log)
	s.drain(p.old, log)
	s.finish(p.progress, fmt.Errorf("verify %s: %w; %s programmed again, %s's rules removed", p.nt, err, ot, p.nt))
}

// migrationRecord is one switch's backends and progress.
type migrationRecord struct {
	progress *statusapi.Migration
	old, nb  proxy.Backend
	oldT, nt proxy.Target
}
