// Package explain answers, for one packet, what kp does with it and why:
// which Service port and which of its addresses the packet is for, every
// endpoint with why it may or may not receive it, the outcome (DNAT to one
// of N with each one's probability, reject and how, drop, or "not kp's"),
// masquerade or not and why, and the conntrack entries the flow already
// has. It reads kp's model (a snapshot, from the running proxy or a file)
// and decides with the core's own rules (proxy.ExplainEndpoints, the
// conntrack Index); it never re-derives endpoint selection. The path
// through the current mode's rules is a per-mode RulePather's job.
package explain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// Model is what kp explain reads: kp's State and the facts of its node.
type Model struct {
	State *proxy.State
	Facts Facts
	// Mode is the mode that runs (nftables, iptables, ipvs, userspace).
	Mode string
	// Version is the kp that took the snapshot ("" when unknown).
	Version   string
	Conntrack []statusapi.ConntrackEntry
	// ConntrackError says why Conntrack is missing or partial.
	ConntrackError string
	// IPTablesBackend is the iptables flavor (nft or legacy) of the modes
	// that write iptables rules.
	IPTablesBackend string
	// Rules are the mode's rules as listed at the snapshot (RulesError
	// says why they are missing): a RulePather takes handles and rule
	// text from them.
	Rules      []proxy.RuleListing
	RulesError string
	// Time is when the snapshot was taken (zero when unknown).
	Time time.Time
	// Affinity are the mode's ClientIP affinity entries at Time, read
	// when AffinityRead; AffinityError says why they are missing or
	// partial, affinitySkipped which of the snapshot's were unusable.
	Affinity        []proxy.AffinityEntry
	AffinityRead    bool
	AffinityError   string
	affinitySkipped []string
}

// Facts are the settings and node facts behind masquerade and NodePorts.
type Facts struct {
	// LocalCIDRs are the sources of pods' traffic (detect-local by CIDR).
	LocalCIDRs []netip.Prefix
	// LocalInterface is set in the interface detect-local modes.
	LocalInterface       string
	LocalInterfacePrefix bool
	MasqueradeAll        bool
	// NodePortIPs are where NodePorts answer; LocalAddrs the node's own.
	NodePortIPs []netip.Addr
	LocalAddrs  []netip.Addr
}

// MaxSnapshotBytes bounds a snapshot file kp explain reads.
const MaxSnapshotBytes = 256 << 20

// ReadSnapshot reads a snapshot (kp snapshot's file, or /kp/v1/snapshot's
// body) from r: at most MaxSnapshotBytes of JSON in SnapshotFormat. A
// truncated file, another format or no model is an error saying which.
func ReadSnapshot(r io.Reader) (*statusapi.Snapshot, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxSnapshotBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	if len(data) > MaxSnapshotBytes {
		return nil, fmt.Errorf("snapshot is larger than %d MiB: not a kp snapshot", MaxSnapshotBytes>>20)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("snapshot is empty")
	}
	var head struct {
		Format string `json:"format"`
	}
	var snap statusapi.Snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		// Read the format alone, to tell another format from damage.
		if json.Unmarshal(data, &head) == nil && head.Format != "" && head.Format != statusapi.SnapshotFormat {
			return nil, formatError(head.Format)
		}
		var syn *json.SyntaxError
		if errors.As(err, &syn) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("snapshot is truncated or not JSON (at byte %d of %d): %w", offset(err, len(data)), len(data), err)
		}
		return nil, fmt.Errorf("snapshot does not hold what %s holds: %w", statusapi.SnapshotFormat, err)
	}
	if snap.Format != statusapi.SnapshotFormat {
		return nil, formatError(snap.Format)
	}
	return &snap, nil
}

func formatError(got string) error {
	if got == "" {
		return fmt.Errorf("not a kp snapshot: no format field (want %q)", statusapi.SnapshotFormat)
	}
	return fmt.Errorf("snapshot format %s: this kp reads %s only; explain it with the kp version that wrote it",
		proxy.QuoteBounded(got), statusapi.SnapshotFormat)
}

func offset(err error, n int) int64 {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return syn.Offset
	}
	return int64(n)
}

// FromSnapshot builds the Model of snap. A snapshot taken before kp's
// first sync, or with an address that does not parse, is an error naming
// the field.
func FromSnapshot(snap *statusapi.Snapshot) (*Model, error) {
	if snap.Services.Generation == 0 && len(snap.Services.ServicePorts) == 0 {
		return nil, errors.New("the snapshot holds no model: kp proxy had not synced yet when it was taken")
	}
	st, err := statusapi.StateFromServices(&snap.Services)
	if err != nil {
		return nil, fmt.Errorf("snapshot: services: %w", err)
	}
	m := &Model{State: st, Mode: snap.Mode, Conntrack: snap.Conntrack, ConntrackError: snap.ConntrackError,
		IPTablesBackend: snap.IPTablesBackend, RulesError: snap.RulesError, Time: snap.Time}
	m.readAffinity(snap)
	if snap.Build != nil {
		m.Version = snap.Build.Version
	}
	for _, r := range snap.Rules {
		m.Rules = append(m.Rules, proxy.RuleListing{Where: r.Where, Format: r.Format, Text: r.Text})
	}
	pf := snap.Proxy
	f := &m.Facts
	f.LocalInterface, f.LocalInterfacePrefix, f.MasqueradeAll = pf.LocalInterface, pf.LocalInterfacePrefix, pf.MasqueradeAll
	if f.LocalCIDRs, err = prefixes("proxy.localCIDRs", pf.LocalCIDRs); err != nil {
		return nil, err
	}
	if f.NodePortIPs, err = addrs("proxy.nodePortIPs", pf.NodePortIPs); err != nil {
		return nil, err
	}
	if f.LocalAddrs, err = addrs("proxy.localAddresses", pf.LocalAddresses); err != nil {
		return nil, err
	}
	return m, nil
}

func addrs(field string, ss []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for i, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("snapshot: %s[%d]: %w", field, i, err)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

func prefixes(field string, ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("snapshot: %s[%d]: %w", field, i, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
