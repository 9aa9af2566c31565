package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/explain"
)

// pathDiffIPT compares a predicted rule path with the kernel's trace: ""
// when they agree, else both paths side by side. They agree when, step by
// step, Where and Verdict are equal, and Handle when both have one. A
// predicted "one of: A | B" verdict accepts any alternative and picks the
// branch; after it, a step whose Where and Verdict list one value per
// alternative ("W1 | W2", "-" where that alternative has no step) is
// compared by the branch picked.
func pathDiffIPT(predicted explain.RulePath, traced []explain.RuleStep) string {
	branch := -1
	j := 0
	var why string
	for i, p := range predicted.Steps {
		where, verdict := p.Where, p.Verdict
		var alts []string
		if v, ok := strings.CutPrefix(verdict, "one of: "); ok {
			alts = strings.Split(v, " | ")
		} else if branch >= 0 && strings.Contains(where, " | ") {
			ws, vs := strings.Split(where, " | "), strings.Split(verdict, " | ")
			if branch >= len(ws) || branch >= len(vs) {
				why = fmt.Sprintf("predicted step %d has no alternative %d", i, branch+1)
				break
			}
			where, verdict = ws[branch], vs[branch]
			if where == "-" {
				continue // this branch has no step here
			}
		}
		if j >= len(traced) {
			why = fmt.Sprintf("predicted step %d (%s: %s) is not in the trace", i, where, verdict)
			break
		}
		t := traced[j]
		j++
		switch {
		case t.Where != where:
			why = fmt.Sprintf("step %d: predicted in %s, the kernel was in %s", j, where, t.Where)
		case alts != nil && !slices.Contains(alts, t.Verdict):
			why = fmt.Sprintf("step %d (%s): the kernel's %q is none of %q", j, where, t.Verdict, alts)
		case alts != nil:
			branch = slices.Index(alts, t.Verdict)
		case t.Verdict != verdict:
			why = fmt.Sprintf("step %d (%s): predicted %q, the kernel %q", j, where, verdict, t.Verdict)
		case p.Handle != 0 && t.Handle != 0 && p.Handle != t.Handle:
			why = fmt.Sprintf("step %d (%s): predicted handle %d, the kernel's %d", j, where, p.Handle, t.Handle)
		}
		if why != "" {
			break
		}
	}
	if why == "" && j < len(traced) {
		why = fmt.Sprintf("the kernel went on past the prediction: step %d (%s: %s)", j+1, traced[j].Where, traced[j].Verdict)
	}
	if why == "" {
		return ""
	}
	var b strings.Builder
	b.WriteString(why + "\npredicted:\n")
	for _, s := range predicted.Steps {
		fmt.Fprintf(&b, "  %s: %s\n", s.Where, s.Verdict)
	}
	b.WriteString("traced:\n")
	for _, s := range traced {
		fmt.Fprintf(&b, "  %s: %s    (%s)\n", s.Where, s.Verdict, s.Rule)
	}
	return b.String()
}

// pathDiffIPT takes any alternative of a random choice, then holds the
// trace to that alternative's branch; a step more, a step less or another
// verdict is a difference.
func TestPathDiffIPTFollowsTheBranchTheKernelTook(t *testing.T) {
	predicted := explain.RulePath{Steps: []explain.RuleStep{
		{Where: "nat KP-SVC-X", Verdict: "one of: jump KP-SEP-A | jump KP-SEP-B"},
		{Where: "nat KP-SEP-A | -", Verdict: "jump KP-MARK-MASQ | -"},
		{Where: "nat KP-SEP-A | nat KP-SEP-B", Verdict: "dnat to 10.0.0.1:80 | dnat to 10.0.0.2:80"},
		{Where: "nat POSTROUTING", Verdict: "jump KP-POSTROUTING", Handle: 7},
	}}
	step := func(where, verdict string) explain.RuleStep { return explain.RuleStep{Where: where, Verdict: verdict} }
	a := []explain.RuleStep{step("nat KP-SVC-X", "jump KP-SEP-A"), step("nat KP-SEP-A", "jump KP-MARK-MASQ"),
		step("nat KP-SEP-A", "dnat to 10.0.0.1:80"), step("nat POSTROUTING", "jump KP-POSTROUTING")}
	b := []explain.RuleStep{step("nat KP-SVC-X", "jump KP-SEP-B"), step("nat KP-SEP-B", "dnat to 10.0.0.2:80"),
		step("nat POSTROUTING", "jump KP-POSTROUTING")}
	otherHandle := slices.Clone(b)
	otherHandle[2].Handle = 8
	for _, tc := range []struct {
		name   string
		traced []explain.RuleStep
		agree  bool
	}{
		{"branch A", a, true},
		{"branch B", b, true},
		{"branch B with A's steps", []explain.RuleStep{b[0], a[1], a[2], a[3]}, false},
		{"a step short", a[:3], false},
		{"a step more", append(slices.Clone(b), step("nat KP-POSTROUTING", "return")), false},
		{"another handle", otherHandle, false},
		{"a choice not offered", []explain.RuleStep{step("nat KP-SVC-X", "jump KP-SEP-C"), b[1], b[2]}, false},
	} {
		if d := pathDiffIPT(predicted, tc.traced); (d == "") != tc.agree {
			t.Errorf("%s: agree %t, want %t: %s", tc.name, d == "", tc.agree, d)
		}
	}
}
