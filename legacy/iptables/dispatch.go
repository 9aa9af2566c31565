package iptables

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/kpproxy/kp/proxy"
)

// Dispatch trees: kp's departure from upstream's layout.
//
// Upstream's KUBE-SERVICES is one list with a rule per service address and
// port, so a new connection (and every new flow that is not to a Service at
// all: nat PREROUTING sees them all) walks up to N rules; at 10,000 service
// ports that is 10,000 rule evaluations per first packet. kp splits each
// shared chain into a 4-ary trie over the low bits of the destination
// address (two bits per level, `-d 0.0.0.8/0.0.0.12` style masks) or, for
// NodePorts, over the port's high bits (`--dport 30720:31743` ranges, one
// subtree per protocol). A node with at most leafRules rules is a leaf
// holding the service ports' own rules; a bigger one splits. At 10,000
// service ports with ClusterIPs from a /16 the trie is 6 levels deep and a
// packet walks at most 4 rules per level plus one leaf (≤ 16 rules, more
// only when one address carries more ports): TestDispatchWalkAt10000Services
// measures a worst walk of about 40 rules, against 10,000.
//
// The trie's shape is a function of the set of keys alone, not of the
// history of syncs: full and partial syncs write the same chains, and a
// change touches only the chains on its key's path (a leaf, and its parent
// when the leaf splits or merges). A depth chosen globally from N would
// need hysteresis to keep a sync near a threshold from renaming every
// chain; a trie that splits locally never rewrites more than one path, so
// it needs none.
const leafRules = 16

// entry is one rule of a shared chain, with the key the trie splits on.
type entry struct {
	key   uint32 // low 32 bits of the destination address, or the port
	proto string // port trees: the rule's protocol
	order int    // rules of one key: lower first
	rule  Rule
}

func sortEntries(es []entry) {
	slices.SortStableFunc(es, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.proto, b.proto), cmp.Compare(a.key, b.key), cmp.Compare(a.order, b.order),
			compareNames(a.rule.Owner, b.rule.Owner), cmp.Compare(a.rule.Args, b.rule.Args))
	})
}

func compareNames(a, b proxy.ServicePortName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}

// tree builds the dispatch trie of one shared chain. It returns the rules
// that go into the chain itself and the trie's other chains, named
// prefix-BITS-HEX after the key bits their path fixes.
type tree struct {
	table  Table
	fam    proxy.Family
	prefix string
	chains []*Chain
}

// addrTree dispatches es by destination address.
func addrTree(table Table, fam proxy.Family, prefix string, es []entry) ([]Rule, []*Chain) {
	sortEntries(es)
	t := &tree{table: table, fam: fam, prefix: prefix}
	return t.addrNode(es, 0, 0, true), t.chains
}

func (t *tree) addrNode(es []entry, bits int, path uint32, top bool) []Rule {
	if len(es) <= leafRules || bits >= 32 || es[0].key == es[len(es)-1].key && sameKey(es) {
		return rules(es)
	}
	var out []Rule
	for v := uint32(0); v < 4; v++ {
		var child []entry
		for _, e := range es {
			if (e.key>>bits)&3 == v {
				child = append(child, e)
			}
		}
		if len(child) == 0 {
			continue
		}
		cpath := path | v<<bits
		name := fmt.Sprintf("%s-%d-%X", t.prefix, bits+2, cpath)
		t.chains = append(t.chains, &Chain{Table: t.table, Name: name, Rules: t.addrNode(child, bits+2, cpath, false)})
		mask := uint32(1)<<(bits+2) - 1
		out = append(out, Rule{Args: fmt.Sprintf("-d %s/%s %s %s", t.lowAddr(cpath), t.lowAddr(mask), verb(top), name)})
	}
	return out
}

// portTree dispatches es by protocol, then destination port.
func portTree(table Table, fam proxy.Family, prefix string, es []entry) ([]Rule, []*Chain) {
	sortEntries(es)
	if len(es) <= leafRules {
		return rules(es), nil
	}
	t := &tree{table: table, fam: fam, prefix: prefix}
	var out []Rule
	for len(es) > 0 {
		proto := es[0].proto
		n := 1
		for n < len(es) && es[n].proto == proto {
			n++
		}
		name := fmt.Sprintf("%s-%s", prefix, proto)
		t.chains = append(t.chains, &Chain{Table: table, Name: name, Rules: t.portNode(es[:n], proto, 16, 0)})
		out = append(out, Rule{Args: fmt.Sprintf("-p %s -j %s", proto, name)})
		es = es[n:]
	}
	return out, t.chains
}

// portNode splits on the two highest port bits below bits, so each child
// is a range of ports.
func (t *tree) portNode(es []entry, proto string, bits int, path uint32) []Rule {
	if len(es) <= leafRules || bits <= 0 || sameKey(es) {
		return rules(es)
	}
	var out []Rule
	shift := bits - 2
	for v := uint32(0); v < 4; v++ {
		var child []entry
		for _, e := range es {
			if (e.key>>shift)&3 == v {
				child = append(child, e)
			}
		}
		if len(child) == 0 {
			continue
		}
		cpath := path | v<<shift
		lo, hi := cpath, cpath|(uint32(1)<<shift-1)
		name := fmt.Sprintf("%s-%s-%d-%X", t.prefix, proto, 18-bits, cpath>>shift)
		t.chains = append(t.chains, &Chain{Table: t.table, Name: name, Rules: t.portNode(child, proto, shift, cpath)})
		out = append(out, Rule{Args: fmt.Sprintf("-m %s -p %s --dport %d:%d -g %s", proto, proto, lo, hi, name)})
	}
	return out
}

func sameKey(es []entry) bool {
	for _, e := range es[1:] {
		if e.key != es[0].key {
			return false
		}
	}
	return true
}

func rules(es []entry) []Rule {
	out := make([]Rule, len(es))
	for i, e := range es {
		out[i] = e.rule
	}
	return out
}

// verb is how a trie level reaches its children: the shared chain jumps
// (its own rules after the trie must still run when a leaf falls through);
// deeper levels go to, so a leaf returns straight to the shared chain.
func verb(top bool) string {
	if top {
		return "-j"
	}
	return "-g"
}

// lowAddr is the address of t's family whose low 32 bits are v and the
// rest zero: as a value it selects the path, as a mask the bits matched.
func (t *tree) lowAddr(v uint32) string {
	if t.fam == proxy.IPv6 {
		var b [16]byte
		b[12], b[13], b[14], b[15] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		return netip.AddrFrom16(b).String()
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}
