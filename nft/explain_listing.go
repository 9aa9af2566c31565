package nft

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

// The rule path's steps named as the snapshot's listing names them: rule
// text and handles from nft -a list table (or the netlink listing).

// resolveStep is s as a RuleStep: the rule's listed text and handle when
// the listing's chain has as many rules as kp renders (else kp's own
// text, and the chain noted in mismatched).
func resolveStep(f family, v *objects, listed map[string][]listedRule, s walkStep, mismatched map[string]bool) explain.RuleStep {
	st := explain.RuleStep{Where: f.name + " " + TableName + " " + s.chain, Rule: s.rule.String(), Verdict: s.verdict, Element: s.element}
	if listed == nil {
		return st
	}
	if lr, ok := listed[s.chain]; ok && len(lr) == len(v.chains[s.chain].Rules) {
		st.Handle = lr[s.index].handle
		if lr[s.index].text != "" {
			st.Rule = lr[s.index].text
		}
	} else {
		mismatched[s.chain] = true
	}
	return st
}

// listedRule is one rule of `nft -a list table`: its text and handle.
type listedRule struct {
	text   string
	handle uint64
}

var (
	listedTable    = regexp.MustCompile(`^table (ip6?) (\S+) \{`)
	listedChain    = regexp.MustCompile(`^chain (.+?) \{`)
	listedRuleLine = regexp.MustCompile(`^(.*) # handle (\d+)$`)
)

// listedChains reads family f's table of kp from the Model's listings
// (`nft -a list table`): each chain's rules with their handles. Nil, with
// why in note, when there is none.
func listedChains(m *explain.Model, f family) (map[string][]listedRule, string) {
	for _, l := range m.Rules {
		if l.Format != "nft" && l.Format != ListingFormatNetlink {
			continue
		}
		if chains := parseListing(l, f); chains != nil {
			if l.Format == ListingFormatNetlink {
				// Handles only: the rule text is kp's description of
				// the kernel's expressions, kp's own rendering reads
				// better.
				for _, rules := range chains {
					for i := range rules {
						rules[i].text = ""
					}
				}
			}
			return chains, ""
		}
	}
	why := "the snapshot has no listing of table " + f.name + " " + TableName
	if m.RulesError != "" {
		why += " (" + m.RulesError + ")"
	}
	return nil, why + ": rule text is kp's own rendering, without handles; a pick chain's slots are this rendering's"
}

// parseListing reads one `nft -a list table` listing if it is f's table
// of kp: "chain NAME {" blocks and their "RULE # handle N" lines (sets and
// maps, whose lines are no chain's, are skipped).
func parseListing(l proxy.RuleListing, f family) map[string][]listedRule {
	var chains map[string][]listedRule
	chain := ""
	for _, line := range strings.Split(l.Text, "\n") {
		line = strings.TrimSpace(line)
		if t := listedTable.FindStringSubmatch(line); t != nil {
			if t[1] != f.name || t[2] != TableName {
				return nil
			}
			chains = map[string][]listedRule{}
			continue
		}
		if chains == nil {
			continue
		}
		switch {
		case chain == "":
			if c := listedChain.FindStringSubmatch(line); c != nil {
				chain = unquote(c[1])
				chains[chain] = []listedRule{}
			}
		case line == "}":
			chain = ""
		default:
			if r := listedRuleLine.FindStringSubmatch(line); r != nil {
				h, _ := strconv.ParseUint(r[2], 10, 64)
				chains[chain] = append(chains[chain], listedRule{text: r[1], handle: h})
			}
		}
	}
	return chains
}

func unquote(s string) string {
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}
	return s
}
