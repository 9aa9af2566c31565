package options

// Facts of upstream kube-proxy kp matches but cannot link (k8s.io/kubernetes
// is not in kp's go.mod, and component-base stays out of the binary: see
// cmd/kp/deps_test.go). upstream_gen.go holds them, generated from the
// pinned k8s.io/kubernetes module (test/k8s/go.mod) by building upstream's
// command and reading its flag set and feature gate registry;
// TestUpstreamFactsAreThePinnedModules regenerates it and fails on any
// difference, so bumping the pinned version is: regenerate, then follow up
// the tests that fail.
//
//go:generate sh -c "cd ../../../test/k8s && CGO_ENABLED=0 go run -trimpath ./cmd/kube-proxy-facts > ../../cmd/kp/options/upstream_gen.go"

// upstreamFlag is one flag of upstream kube-proxy's command line.
type upstreamFlag struct {
	name, shorthand string
	typ             string // as --help prints it: string, int32, duration, LocalMode...
	listed          bool   // --help lists it (upstream hides deprecated flags)
}

// upstreamGate is one feature gate upstream kube-proxy's registry knows, as
// it is at upstreamGatesVersion.
type upstreamGate struct {
	def        bool
	preRelease string // ALPHA, BETA, DEPRECATED; empty for GA
	locked     bool   // locked to def: setting the other value is an error
}

// stage is the gate's stage as upstream's messages name it.
func (g upstreamGate) stage() string {
	if g.preRelease == "" {
		return "GA"
	}
	return g.preRelease
}

// UpstreamFlags names upstream kube-proxy's flags (without dashes): all of
// them, or only those its --help lists. For tests holding kp proxy's
// command line to upstream's.
func UpstreamFlags(listedOnly bool) []string {
	var out []string
	for _, f := range upstreamFlags {
		if f.listed || !listedOnly {
			out = append(out, f.name)
		}
	}
	return out
}
