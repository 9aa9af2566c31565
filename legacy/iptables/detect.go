package iptables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// FlavorAuto is the flag value that asks Detect to choose the flavor.
const FlavorAuto Flavor = "auto"

// ParseFlavor parses a flag value: auto, nft or legacy. FlavorAuto means the
// caller should call Detect.
func ParseFlavor(s string) (Flavor, error) {
	switch fl := Flavor(s); fl {
	case FlavorAuto, FlavorNFT, FlavorLegacy:
		return fl, nil
	}
	return "", fmt.Errorf("iptables backend %q: want one of auto, nft, legacy", s)
}

// Detect chooses the iptables flavor of this node (of the network
// namespace of the calling thread) as upstream's iptables-wrapper does, so
// that kp writes where kubelet, kube-proxy and the CNI plugin write:
//
//  1. the flavor holding kubelet's hint chains (KUBE-IPTABLES-HINT or
//     KUBE-KUBELET-CANARY in mangle, either family): kubelet 1.17+ creates
//     them in the flavor the node uses;
//  2. else the flavor holding KUBE-* or KP-* chains (kube-proxy's, or kp's
//     from an earlier run);
//  3. else the flavor with more rules, legacy only when it has strictly more;
//  4. else nft.
//
// When both flavors match a step, nft wins, as in upstream. A flavor whose
// binaries are missing, or whose kernel part is, is never chosen; the
// error is for neither working, or for a flavor that is there but could
// not be read (a *ReadError: permission denied, say), since its rules may
// be what decides.
// reason is a sentence for the log.
func Detect(ctx context.Context, log *slog.Logger) (fl Flavor, reason string, err error) {
	return DetectFrom(ctx, log, SaveAll)
}

// DetectFrom is Detect reading the rules through save.
func DetectFrom(ctx context.Context, log *slog.Logger, save SaveAllFunc) (Flavor, string, error) {
	seen := map[Flavor]*flavorRules{}
	var errs []error
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		r := &flavorRules{}
		for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			data, err := save(ctx, fl, f)
			if err != nil && !Absent(err) {
				// Unread is not empty: the rules that decide may be
				// there (kubelet's hint in legacy, read without
				// CAP_NET_RAW), and a guess would program the other
				// flavor beside them.
				return "", "", fmt.Errorf("detect iptables backend: %w", err)
			}
			if err != nil {
				// An IPv6-less kernel lacks ip6tables alone; the
				// flavor still counts when its IPv4 half answers.
				log.Debug("iptables backend detection: flavor absent", "flavor", fl, "family", f, "err", err)
				errs = append(errs, err)
				continue
			}
			r.add(log, fl, f, data)
			r.usable = true
		}
		if r.usable {
			seen[fl] = r
		}
	}
	nft, legacy := seen[FlavorNFT], seen[FlavorLegacy]
	switch {
	case nft == nil && legacy == nil:
		return "", "", fmt.Errorf("detect iptables backend: neither iptables-nft nor iptables-legacy works: %w", errors.Join(errs...))
	case legacy == nil:
		return FlavorNFT, "only iptables-nft works on this node", nil
	case nft == nil:
		return FlavorLegacy, "only iptables-legacy works on this node", nil
	}
	for _, step := range []struct {
		has  func(*flavorRules) bool
		what string
	}{
		{func(r *flavorRules) bool { return r.kubeletHint != "" }, "kubelet's hint chain"},
		{func(r *flavorRules) bool { return r.kubeChain != "" }, "Kubernetes proxy chains"},
	} {
		if step.has(nft) {
			return FlavorNFT, fmt.Sprintf("iptables-nft holds %s (%s)", step.what, nft.example(step.what)), nil
		}
		if step.has(legacy) {
			return FlavorLegacy, fmt.Sprintf("iptables-legacy holds %s (%s)", step.what, legacy.example(step.what)), nil
		}
	}
	if legacy.rules > nft.rules {
		return FlavorLegacy, fmt.Sprintf("no Kubernetes chains in either backend; iptables-legacy holds more rules (%d against iptables-nft's %d)", legacy.rules, nft.rules), nil
	}
	if nft.rules > 0 {
		return FlavorNFT, fmt.Sprintf("no Kubernetes chains in either backend; iptables-nft holds at least as many rules (%d against iptables-legacy's %d)", nft.rules, legacy.rules), nil
	}
	return FlavorNFT, "no rules in either backend; iptables-nft is the default", nil
}

// flavorRules is what Detect found in one flavor's two families.
type flavorRules struct {
	usable      bool
	kubeletHint string // "mangle KUBE-IPTABLES-HINT (IPv4)", "" when none
	kubeChain   string // "nat KUBE-SERVICES (IPv6)", "" when none
	rules       int
}

func (r *flavorRules) example(what string) string {
	if what == "kubelet's hint chain" {
		return r.kubeletHint
	}
	return r.kubeChain
}

func (r *flavorRules) add(log *slog.Logger, fl Flavor, f proxy.Family, data []byte) {
	dumps, err := ParseSave(data)
	if err != nil {
		log.Warn("iptables backend detection: cannot parse rules; ignoring them", "flavor", fl, "family", f, "err", err)
		return
	}
	tables := slices.Sorted(maps.Keys(dumps))
	for _, t := range tables {
		d := dumps[t]
		for _, c := range d.Chains {
			where := fmt.Sprintf("%s %s in %s", t, c, f)
			if t == TableMangle && (c == "KUBE-IPTABLES-HINT" || c == "KUBE-KUBELET-CANARY") && r.kubeletHint == "" {
				r.kubeletHint = where
			}
			if (strings.HasPrefix(c, "KUBE-") || strings.HasPrefix(c, ownChainPrefix)) && r.kubeChain == "" {
				r.kubeChain = where
			}
		}
		r.rules += d.RuleCount()
	}
}

// ownChainPrefix starts the name of every chain kp writes.
const ownChainPrefix = "KP-"
