package conformance

import "regexp"

// A Limit is a known limit of a kp mode, documented in docs/features.md's
// feature table, that explains why an upstream test fails in that mode's
// column: a test it explains is listed with it, apart from the failures
// nothing explains.
type Limit struct {
	// Failure matches the failure's message (Result.Reason).
	Failure *regexp.Regexp
	// Test, when set, must match the test's name too.
	Test *regexp.Regexp
	Why  string
}

// knownLimits are the limits per kp column.
var knownLimits = map[string][]Limit{
	"kp-userspace": {{
		Failure: regexp.MustCompile(`(?i)client IP|source IP`),
		Why: "the userspace proxy opens its own connection to the endpoint, which sees the node's address, " +
			"not the client's (docs/features.md, note ³)",
	}, {
		// A pod's connection to another node's NodePort is short-circuited
		// to the Service's endpoints (upstream's rule for pod traffic to
		// external addresses). In the kernel modes the DNATed reply from
		// an endpoint on the pod's own node goes straight back to the pod,
		// which drops it: the connection fails, as this test expects. The
		// userspace proxy's own connection to the endpoint does not break.
		Test:    regexp.MustCompile(`fallback to local terminating endpoints .*externalTrafficPolicy=Local`),
		Failure: regexp.MustCompile(`expected error when trying to connect to node port`),
		Why: "a pod's connection to another node's NodePort is short-circuited to every endpoint, as upstream " +
			"does; in the kernel modes the DNATed reply of an endpoint on the pod's own node bypasses that node " +
			"and the connection fails, which the test expects; the userspace proxy terminates the connection " +
			"and reaches the endpoint with its own, which works",
	}},
}

// reason is test name's failure message in column mode.
func (r *Results) reason(name, mode string) string {
	for _, t := range r.Tests {
		if t.Name == name {
			return t.Results[mode].Reason
		}
	}
	return ""
}

// explained returns the known limit of column mode that explains test
// name's failure with message reason, if one does.
func explained(mode, name, reason string) (string, bool) {
	for _, l := range knownLimits[mode] {
		if l.Failure.MatchString(reason) && (l.Test == nil || l.Test.MatchString(name)) {
			return l.Why, true
		}
	}
	return "", false
}
