package server

import (
	"context"
	"net/http"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// SnapshotFacts completes a snapshot with what the server does not read
// itself (cmd/kp supplies it): the node's addresses and where NodePorts
// answer (ProxyFacts' LocalAddresses, NodePortIPs), the conntrack entries
// of Service addresses. st is the State the snapshot lists (nil before the
// first sync).
type SnapshotFacts func(ctx context.Context, st *proxy.State, snap *statusapi.Snapshot)

// snapshotTimeout bounds listing the rules and the conntrack entries.
const snapshotTimeout = 20 * time.Second

// SetSnapshot records the settings the snapshot reports (the proxy's
// Config) and what completes it.
func (s *Status) SetSnapshot(cfg proxy.Config, facts SnapshotFacts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg, s.facts = cfg, facts
}

// Snapshot returns the body of /kp/v1/snapshot: the model last synced
// with the facts kp's decisions hang on, the mode's rules as listed and
// the conntrack entries of Service addresses.
func (s *Status) Snapshot(ctx context.Context) *statusapi.Snapshot {
	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	rep := s.Report()
	s.mu.RLock()
	st, cfg, facts := s.state, s.cfg, s.facts
	s.mu.RUnlock()
	snap := &statusapi.Snapshot{
		Format: statusapi.SnapshotFormat, Build: rep.Build, Time: s.clk.Now(),
		Mode: rep.Mode, IPTablesBackend: rep.IPTablesBackend,
		Services: *s.ServicesReport("", ""),
		Proxy:    proxyFacts(cfg, s.backend),
	}
	if rl, ok := s.backend.(proxy.RuleLister); ok {
		rules, err := rl.ListRules(ctx)
		for _, r := range rules {
			snap.Rules = append(snap.Rules, statusapi.RuleListing{Where: r.Where, Format: r.Format, Text: r.Text})
		}
		if err != nil {
			snap.RulesError = err.Error()
		}
	} else {
		snap.RulesError = "the " + rep.Mode + " mode does not list its rules yet"
	}
	snap.Affinity, snap.AffinityError = affinityEntries(ctx, s.backend, st, rep.Mode)
	if facts != nil {
		facts(ctx, st, snap)
	}
	return snap
}

// proxyFacts are cfg's settings behind the masquerade and NodePort
// decisions; the NodePort scope is the running mode's (it follows a
// switch).
func proxyFacts(cfg proxy.Config, backend proxy.Backend) statusapi.ProxyFacts {
	mode := string(cfg.DetectLocal.Mode)
	if mode == "" {
		mode = string(proxy.LocalModeClusterCIDR)
	}
	pf := statusapi.ProxyFacts{DetectLocalMode: mode, LocalCIDRs: prefixStrings(cfg.LocalCIDRs()),
		MasqueradeAll: cfg.MasqueradeAll}
	if name, prefix, ok := cfg.LocalInterface(); ok {
		pf.LocalInterface, pf.LocalInterfacePrefix = name, prefix
	}
	cidrs, primary := cfg.NodePortAddresses, cfg.NodePortPrimary
	if sc, ok := backend.(proxy.NodePortScoper); ok {
		cidrs, primary = sc.NodePortScope()
	}
	pf.NodePortAddresses, pf.NodePortPrimary = prefixStrings(cidrs), primary
	return pf
}

func (s *Status) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, s.Snapshot(r.Context()))
}
