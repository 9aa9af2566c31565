package explain

import (
	"cmp"
	"slices"
	"strings"
)

// BranchSteps are the steps that follow a random choice, given each
// alternative's own (its tail): steps every alternative takes are written
// once; elsewhere a step's Where, Verdict and Rule list one value per
// alternative, in the alternatives' order, joined by " | " ("-" where that
// alternative has no step there), and so does its Element when any has one. The alternatives' steps are lined up
// where they meet again (alignBranches), so that a reader, or a trace
// compared by branch, sees where the paths part and meet.
func BranchSteps(tails [][]RuleStep) []RuleStep {
	if len(tails) == 0 {
		return nil
	}
	var out []RuleStep
	for _, col := range alignBranches(tails) {
		var wheres, verdicts, rules, elements []string
		var shared *RuleStep
		anyElement := false
		for _, s := range col {
			if s == nil {
				wheres, verdicts, rules, elements = append(wheres, "-"), append(verdicts, "-"), append(rules, "-"), append(elements, "-")
				continue
			}
			shared = s
			wheres, verdicts, rules = append(wheres, s.Where), append(verdicts, s.Verdict), append(rules, s.Rule)
			elements = append(elements, cmp.Or(s.Element, "-"))
			anyElement = anyElement || s.Element != ""
		}
		if allSame(wheres) && allSame(verdicts) && allSame(rules) && allSame(elements) {
			out = append(out, *shared)
			continue
		}
		step := RuleStep{Where: strings.Join(wheres, " | "), Verdict: strings.Join(verdicts, " | "), Rule: strings.Join(rules, " | ")}
		if anyElement {
			step.Element = strings.Join(elements, " | ")
		}
		out = append(out, step)
	}
	return out
}

// alignBranches lines the alternatives' steps up in columns (one step or
// nil per alternative), the steps they share in one column where the
// order allows (a longest common subsequence with the columns so far),
// so that a reader sees where the paths part and meet again.
func alignBranches(tails [][]RuleStep) [][]*RuleStep {
	n := len(tails)
	key := func(s *RuleStep) string { return s.Where + "\x00" + s.Verdict + "\x00" + s.Rule }
	var cols [][]*RuleStep
	for i := range tails[0] {
		col := make([]*RuleStep, n)
		col[0] = &tails[0][i]
		cols = append(cols, col)
	}
	for b := 1; b < n; b++ {
		t := tails[b]
		colKey := func(c []*RuleStep) string {
			for _, s := range c {
				if s != nil {
					return key(s)
				}
			}
			return ""
		}
		// lcs[i][j]: common length of cols[i:] and t[j:].
		lcs := make([][]int, len(cols)+1)
		for i := range lcs {
			lcs[i] = make([]int, len(t)+1)
		}
		for i := len(cols) - 1; i >= 0; i-- {
			for j := len(t) - 1; j >= 0; j-- {
				if colKey(cols[i]) == key(&t[j]) {
					lcs[i][j] = lcs[i+1][j+1] + 1
				} else {
					lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
				}
			}
		}
		var merged [][]*RuleStep
		i, j := 0, 0
		for i < len(cols) || j < len(t) {
			switch {
			case i < len(cols) && j < len(t) && colKey(cols[i]) == key(&t[j]):
				cols[i][b] = &t[j]
				merged = append(merged, cols[i])
				i, j = i+1, j+1
			case j == len(t) || i < len(cols) && lcs[i+1][j] >= lcs[i][j+1]:
				merged = append(merged, cols[i])
				i++
			default:
				col := make([]*RuleStep, n)
				col[b] = &t[j]
				merged = append(merged, col)
				j++
			}
		}
		cols = merged
	}
	// Between the columns every alternative has a step in (where the
	// paths meet), each alternative's own steps are zipped into columns,
	// aligned at their end: "SEP-A dnat | SEP-B dnat" rather than two
	// half-empty columns, slot-0's rules beside slot-1's.
	var out, seg [][]*RuleStep
	flush := func() {
		lists := make([][]*RuleStep, n)
		width := 0
		for _, c := range seg {
			for b, s := range c {
				if s != nil {
					lists[b] = append(lists[b], s)
					width = max(width, len(lists[b]))
				}
			}
		}
		for j := range width {
			col := make([]*RuleStep, n)
			for b, l := range lists {
				if k := j - (width - len(l)); k >= 0 {
					col[b] = l[k]
				}
			}
			out = append(out, col)
		}
		seg = seg[:0]
	}
	for _, c := range cols {
		if !slices.Contains(c, nil) {
			flush()
			out = append(out, c)
			continue
		}
		seg = append(seg, c)
	}
	flush()
	return out
}

func allSame(ss []string) bool {
	for _, s := range ss[1:] {
		if s != ss[0] {
			return false
		}
	}
	return true
}
