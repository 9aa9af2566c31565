package iptables

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/kpproxy/kp/explain"
)

// The packet's walk through a ruleSet, as the kernel's xtables evaluate
// it for a connection's first packet: per hook the built-in chain's jumps
// into kp's chains in order, rule by rule, a user chain returning to its
// caller (or, reached by -g, to its caller's caller). It reads the matches
// kp's own rules use (render, skeleton, dispatch), nothing else.

// walkPacket is the WalkPacket with the node's addresses, which tell
// whether the destination is local again after DNAT.
type walkPacket struct {
	WalkPacket
	local []netip.Addr
}

func newWalkPacket(m *explain.Model, p explain.Packet, e *explain.Explanation) walkPacket {
	pk := walkPacket{WalkPacket: WalkPacket{Src: p.Src, Dst: p.Dst.Addr(), SrcLocal: e.Source.Node,
		InLocal: e.Source.Pod != nil && *e.Source.Pod, Proto: strings.ToLower(string(p.Protocol)), DPort: p.Dst.Port(),
		LocalCIDRs: m.Facts.LocalCIDRs, CtStates: []string{"NEW"}}, local: slices.Concat(m.Facts.LocalAddrs, m.Facts.NodePortIPs)}
	pk.DstLocal = pk.isLocal(pk.Dst)
	if e.Affinity != nil && e.Affinity.PinnedTo != "" && e.Service != nil {
		ep, _, _ := strings.Cut(e.Affinity.PinnedTo, " ")
		ap, err := netip.ParseAddrPort(ep)
		for name, sp := range m.State.Services {
			if err != nil || name.Namespace != e.Service.Namespace || name.Name != e.Service.Name || name.Port != e.Service.PortName ||
				string(name.Protocol) != e.Service.Protocol {
				continue
			}
			for _, x := range m.State.Endpoints[name] {
				if x.AddrPort() == ap {
					pk.Pinned = sepChainName(sp, x)
				}
			}
		}
	}
	return pk
}

func (pk *walkPacket) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(pk.local, a)
}

// pathWalk is one walk of the packet; at a random choice it takes alternative
// choose.
type pathWalk struct {
	rs     *ruleSet
	pk     walkPacket
	steps  []explain.RuleStep
	choose int
	// choice is the first random choice met: its step's index and each
	// alternative's verdict and next chain.
	choice *choice
	done   bool
}

type choice struct {
	at       int
	verdicts []string
	chains   []string
	rules    []string
}

// walkAll walks pk through every hook, once per alternative of a random
// choice, and merges the walks (RulePather's doc says how).
func (rs *ruleSet) walkAll(pk walkPacket) []explain.RuleStep {
	first := rs.walk(pk, 0)
	if first.choice == nil {
		return first.steps
	}
	c := first.choice
	walks := []*pathWalk{first}
	for i := 1; i < len(c.verdicts); i++ {
		walks = append(walks, rs.walk(pk, i))
	}
	out := slices.Clone(first.steps[:c.at])
	pick := first.steps[c.at]
	pick.Verdict = "one of: " + strings.Join(c.verdicts, " | ")
	pick.Element = strings.Join(c.chains, " | ")
	pick.Rule = strings.Join(c.rules, " | ")
	out = append(out, pick)
	var tails [][]explain.RuleStep
	for _, w := range walks {
		tails = append(tails, w.steps[c.at+1:])
	}
	return append(out, explain.BranchSteps(tails)...)
}

func (rs *ruleSet) walk(pk walkPacket, choose int) *pathWalk {
	pk.CtStates = slices.Clone(pk.CtStates) // each alternative's walk changes its own
	w := &pathWalk{rs: rs, pk: pk, choose: choose}
	if pk.SrcLocal {
		w.hooks(hook{TableNAT, "OUTPUT"}, hook{TableFilter, "OUTPUT"}, hook{TableNAT, "POSTROUTING"})
		// The node's walkPacket to one of its own addresses comes back in
		// through lo: filter INPUT sees it; nat PREROUTING does not (its
		// connection's NAT is set up already).
		if w.pk.isLocal(w.pk.Dst) {
			w.hooks(hook{TableFilter, "INPUT"})
		}
		return w
	}
	w.hooks(hook{TableNAT, "PREROUTING"})
	if w.pk.isLocal(w.pk.Dst) {
		w.hooks(hook{TableFilter, "INPUT"})
	} else {
		w.hooks(hook{TableFilter, "FORWARD"}, hook{TableNAT, "POSTROUTING"})
	}
	return w
}

type hook struct {
	table Table
	chain string
}

// hooks runs the built-in chains' jumps into kp's chains, in order.
func (w *pathWalk) hooks(hs ...hook) {
	for _, h := range hs {
		if w.done {
			return
		}
		k := chainKey{h.table, h.chain}
		for _, j := range w.rs.builtinOrder(k) {
			if !w.pk.Matches(j.extra) {
				continue
			}
			w.step(h.table, h.chain, w.rs.jumpText(k, j), "jump "+j.to)
			out := w.call(h.table, j.to)
			if out == stop {
				w.done = true
			}
			if out == accept || out == stop {
				break
			}
		}
	}
}

func (w *pathWalk) step(t Table, chain, rule, verdict string) {
	w.steps = append(w.steps, explain.RuleStep{Where: string(t) + " " + chain, Rule: rule, Verdict: verdict})
}

// call runs chain name of table t.
func (w *pathWalk) call(t Table, name string) outcome {
	k := chainKey{t, name}
	c := w.rs.chains[k]
	if c == nil {
		return next
	}
	for i := 0; i < len(c.Rules); i++ {
		args := c.Rules[i].Args
		if w.random(args) {
			var out outcome
			i, out = w.choose1(t, k, c, i)
			if out != next {
				if out == ret {
					return next
				}
				return out
			}
			continue
		}
		if !w.pk.Matches(args) {
			continue
		}
		out := w.apply(t, k, c, i, args)
		if out != next {
			if out == ret {
				return next
			}
			return out
		}
	}
	return next
}

// random reports whether a rule starts a choice the model cannot make: a
// statistic rule (the random pick), or, with ClientIP affinity and the
// client's entry unknown, a --rcheck rule (the entry's pick, else the
// random one).
func (w *pathWalk) random(args string) bool {
	return hasWord(args, "statistic") || w.pk.Pinned == "" && hasWord(args, "--rcheck")
}

// choose1 takes the choice that starts at rule i: the rules up to the
// first that is no choice, one of which matches. Each next chain they
// name is an alternative (an endpoint's KP-SEP-, whichever rule names
// it); the walk takes alternative w.choose at the first choice it meets.
// It returns the group's last rule and the outcome of the one taken.
func (w *pathWalk) choose1(t Table, k chainKey, c *Chain, i int) (int, outcome) {
	end := i
	for end < len(c.Rules)-1 && w.random(c.Rules[end].Args) {
		end++
	}
	var texts, chains []string
	var firsts []int // the first rule naming each alternative
	for j := i; j <= end; j++ {
		texts = append(texts, w.rs.ruleText(k, c, j))
		if tgt := RuleTarget(c.Rules[j].Args); !slices.Contains(chains, tgt) {
			chains, firsts = append(chains, tgt), append(firsts, j)
		}
	}
	pick := firsts[0]
	if len(firsts) > 1 && w.choice == nil {
		ch := &choice{at: len(w.steps), chains: chains, rules: texts}
		for _, tgt := range chains {
			ch.verdicts = append(ch.verdicts, "jump "+tgt)
		}
		w.choice = ch
		pick = firsts[min(w.choose, len(firsts)-1)]
	}
	at := len(w.steps)
	out := w.apply(t, k, c, pick, c.Rules[pick].Args)
	if len(texts) > 1 {
		w.steps[at].Rule = strings.Join(texts, " | ") // which of them matched is the kernel's state
	}
	return end, out
}

// apply takes rule i's target, the rule having matched.
func (w *pathWalk) apply(t Table, k chainKey, c *Chain, i int, args string) outcome {
	verdict, out, to := w.pk.take(args, func(to string) bool { return w.rs.chains[chainKey{t, to}] != nil })
	w.pk.DstLocal = w.pk.isLocal(w.pk.Dst)
	w.step(t, k.name, w.rs.ruleText(k, c, i), verdict)
	switch out {
	case call, jumpGoto:
		if o := w.call(t, to); o == accept || o == stop {
			return o
		}
		if out == jumpGoto {
			return ret
		}
		return next
	}
	return out
}
