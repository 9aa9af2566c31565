package options

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Feature gates: kp accepts every gate upstream kube-proxy's registry knows
// (upstreamGates, generated from the pinned module) and checks a setting as
// upstream's featuregate.SetFromMap does, with its messages: an unknown name,
// a locked gate set against its default and an enabled gate whose
// dependencies are disabled are errors. The gates that change what a proxy
// does are honoured (honouredGates); every other gate set is logged once as
// ignored, since it tunes parts of Kubernetes kp does not have.

// honouredGates are the gates that change what kp does, and how.
var honouredGates = map[string]string{
	"AllowServiceExternalIPs": "false: Services' externalIPs are not proxied",
	"LoggingBetaOptions":      "false: the json log format is refused",
	"LoggingAlphaOptions":     "true: the split-stream and info-buffer logging options are allowed",
	// Locked to true: kp always behaves as they say.
	"PreferSameTrafficDistribution": "locked to true: trafficDistribution PreferSameZone/PreferSameNode are followed",
	"MultiCIDRServiceAllocator":     "locked to true: ServiceCIDR objects are watched",
}

// featureGateSet is the gates set explicitly (by the file or the flag), with
// AllAlpha and AllBeta spread over the gates of their stage.
type featureGateSet map[string]bool

// enabled is a gate's value: set explicitly, or upstream's default.
func (s featureGateSet) enabled(name string) bool {
	if v, ok := s[name]; ok {
		return v
	}
	return upstreamGates[name].def
}

// resolveFeatureGates checks m as upstream's SetFromMap does and returns
// the gates' state. Gates are checked in name order (upstream's order is a
// map's); an unknown one stops the check, as upstream's does.
func resolveFeatureGates(m map[string]bool) (featureGateSet, error) {
	set := featureGateSet{}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(m)) {
		v := m[name]
		g, ok := upstreamGates[name]
		if !ok {
			errs = append(errs, fmt.Errorf("unrecognized feature gate: %s", name))
			return nil, aggregate(errs)
		}
		if g.locked && g.def != v {
			errs = append(errs, fmt.Errorf("cannot set feature gate %s to %t, feature is locked to %t", name, v, g.def))
			continue
		}
		set[name] = v
	}
	for name, stage := range map[string]string{"AllAlpha": "ALPHA", "AllBeta": "BETA"} {
		v, ok := m[name]
		if !ok {
			continue
		}
		for gate, g := range upstreamGates {
			if _, explicit := m[gate]; !explicit && g.preRelease == stage && gate != "AllAlpha" && gate != "AllBeta" {
				set[gate] = v
			}
		}
	}
	if len(errs) > 0 {
		return nil, aggregate(errs)
	}
	for _, name := range slices.Sorted(maps.Keys(upstreamGateDependencies)) {
		if !set.enabled(name) {
			continue
		}
		var off []string
		for _, dep := range upstreamGateDependencies[name] {
			if !set.enabled(dep) {
				off = append(off, dep)
			}
		}
		if len(off) > 0 {
			errs = append(errs, fmt.Errorf("%s is enabled, but depends on features that are disabled: [%s]", name, strings.Join(off, " ")))
		}
	}
	if len(errs) > 0 {
		return nil, aggregate(errs)
	}
	return set, nil
}

// aggregate joins errors as upstream's utilerrors.NewAggregate prints them:
// one alone, several as [a, b].
func aggregate(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New("[" + strings.Join(msgs, ", ") + "]")
}

// ignoredGates are the gates of m that kp does not act on, each with the
// reason logged at start.
func ignoredGates(m map[string]bool) []IgnoredSetting {
	var out []IgnoredSetting
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if _, ok := honouredGates[name]; ok {
			continue
		}
		g := upstreamGates[name]
		reason := "no part of kp depends on it"
		switch {
		case name == "AllAlpha" || name == "AllBeta":
			reason = "spreads over the gates of its stage; only the proxy's own gates change kp"
		case g.preRelease == "" || g.preRelease == "DEPRECATED":
			reason = fmt.Sprintf("a %s gate that no part of kp depends on", g.stage())
		}
		out = append(out, IgnoredSetting{Name: fmt.Sprintf("feature gate %s=%t", name, m[name]), Reason: reason})
	}
	return out
}

// featureGates is upstream's --feature-gates value: comma-separated
// Name=true|false pairs, the flag repeatable.
type featureGates map[string]bool

func (f featureGates) String() string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(f)) {
		out = append(out, fmt.Sprintf("%s=%t", name, f[name]))
	}
	return strings.Join(out, ",")
}

func (f featureGates) Set(s string) error {
	for item := range strings.SplitSeq(s, ",") {
		if item == "" {
			continue
		}
		name, val, ok := strings.Cut(item, "=")
		if !ok {
			return errors.New("malformed pair, expect string=bool")
		}
		name, val = strings.TrimSpace(name), strings.TrimSpace(val)
		b, err := strconv.ParseBool(val)
		if err != nil {
			return fmt.Errorf("invalid value of %s: %s, err: %v", name, val, err)
		}
		f[name] = b
	}
	return nil
}

func (f featureGates) Type() string { return "mapStringBool" }

// gatesHelp is --feature-gates' help: upstream's list of the gates it
// shows (not GA, not deprecated), with each one's stage and default.
func gatesHelp() string {
	var lines []string
	for _, name := range slices.Sorted(maps.Keys(upstreamGates)) {
		g := upstreamGates[name]
		if g.preRelease != "ALPHA" && g.preRelease != "BETA" {
			continue
		}
		lines = append(lines, fmt.Sprintf("%s=true|false (%s - default=%t)", name, g.preRelease, g.def))
	}
	return strings.Join(lines, "\n")
}

// CheckFeatureGates checks gates as kp proxy (and upstream's kube-proxy)
// checks its featureGates: nil when both would accept them.
func CheckFeatureGates(gates map[string]bool) error {
	_, err := resolveFeatureGates(gates)
	return err
}
