package nft

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kpproxy/kp/proxy"
)

// ListingFormatNetlink is the format of a listing read through netlink
// when the nft CLI is not there (kp's image has none): the layout of `nft
// -a list table` (chains, each rule with "# handle N"), each rule as kp
// describes its expressions, which is not nft's syntax. kp explain takes
// the handles from it and keeps its own rule text.
const ListingFormatNetlink = "nft-netlink"

// ruleLister is a Conn that can list kp's tables itself.
type ruleLister interface {
	listTable(f family) (text string, found bool, err error)
}

// listTable lists family f's table of kp through netlink: its chains in
// the kernel's order, each rule with its handle.
func (c *netlinkConn) listTable(f family) (string, bool, error) {
	conn, err := c.open()
	if err != nil {
		return "", false, fmt.Errorf("open netlink: %w", err)
	}
	tables, err := conn.ListTablesOfFamily(f.nf)
	if err != nil {
		return "", false, fmt.Errorf("list %s tables: %w", f.name, err)
	}
	var table *nftables.Table
	for _, t := range tables {
		if t.Name == TableName {
			table = t
		}
	}
	if table == nil {
		return "", false, nil
	}
	chains, err := conn.ListChainsOfTableFamily(f.nf)
	if err != nil {
		return "", false, fmt.Errorf("list %s chains: %w", f.name, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# read through netlink (no nft CLI): each rule as kp describes its expressions\n")
	fmt.Fprintf(&b, "table %s %s {\n", f.name, TableName)
	for _, ch := range chains {
		if ch.Table.Name != TableName {
			continue
		}
		rules, err := conn.GetRules(table, ch)
		if err != nil {
			return "", false, fmt.Errorf("list the rules of chain %s in %s %s: %w", ch.Name, f.name, TableName, err)
		}
		fmt.Fprintf(&b, "\tchain %s {\n", ch.Name)
		if ch.Hooknum != nil && ch.Priority != nil {
			fmt.Fprintf(&b, "\t\ttype %s hook %d priority %d;\n", ch.Type, *ch.Hooknum, *ch.Priority)
		}
		for _, r := range rules {
			fmt.Fprintf(&b, "\t\t%s # handle %d\n", describeExprs(f, r.Exprs), r.Handle)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String(), true, nil
}

// listRulesNetlink is ListRules without the nft CLI.
func (b *Backend) listRulesNetlink(l ruleLister) ([]proxy.RuleListing, error) {
	var out []proxy.RuleListing
	for _, f := range families {
		text, found, err := l.listTable(f)
		if err != nil {
			return out, fmt.Errorf("nftables mode: %w", err)
		}
		if found {
			out = append(out, proxy.RuleListing{Where: "nftables " + f.name + " " + TableName, Format: ListingFormatNetlink, Text: text})
		}
	}
	return out, nil
}

// describeExprs is kp's description of a rule read back from the kernel:
// one word or two per expression, close to nft's syntax for those kp's
// rule builder writes (rule.go); data in hex where the load before it does
// not say what it is.
func describeExprs(f family, es []expr.Any) string {
	var words []string
	loaded := map[uint32]string{} // register → what the last load put there
	lastLoad, afterBitwise := false, false
	for _, e := range es {
		// Loads one after another build a concatenation: "a . b".
		load := isLoad(e)
		if load && lastLoad {
			words = append(words, ".")
		}
		lastLoad = load
		wasBitwise := afterBitwise
		_, afterBitwise = e.(*expr.Bitwise)
		switch e := e.(type) {
		case *expr.Payload:
			what := fmt.Sprintf("@%d,%d,%d", e.Base, e.Offset*8, e.Len*8)
			switch {
			case e.Base == expr.PayloadBaseNetworkHeader:
				for _, src := range []bool{true, false} {
					if off, n := (&ruleBuilder{fam: f}).addrOffset(src); off == e.Offset && n == e.Len {
						what = f.name + " " + addrField(src)
					}
				}
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2:
				what = "th dport"
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 13 && e.Len == 1:
				what = "tcp flags"
			}
			words, loaded[e.DestRegister] = append(words, what), what
		case *expr.Meta:
			what := map[expr.MetaKey]string{expr.MetaKeyL4PROTO: "meta l4proto", expr.MetaKeyMARK: "meta mark",
				expr.MetaKeyIIFNAME: "iifname"}[e.Key]
			if what == "" {
				what = fmt.Sprintf("meta %d", e.Key)
			}
			if e.SourceRegister {
				what += " set"
			}
			words, loaded[e.Register] = append(words, what), what
		case *expr.Ct:
			what := map[expr.CtKey]string{expr.CtKeySTATE: "ct state", expr.CtKeySTATUS: "ct status", expr.CtKeyMARK: "ct mark"}[e.Key]
			if what == "" {
				what = fmt.Sprintf("ct %d", e.Key)
			}
			if e.SourceRegister {
				what += " set"
			}
			words, loaded[e.Register] = append(words, what), what
		case *expr.Cmp:
			eq := ""
			if wasBitwise {
				eq = "== "
			}
			op := map[expr.CmpOp]string{expr.CmpOpEq: eq, expr.CmpOpNeq: "!= ", expr.CmpOpLt: "< ", expr.CmpOpLte: "<= ",
				expr.CmpOpGt: "> ", expr.CmpOpGte: ">= "}[e.Op]
			words = append(words, op+describeData(loaded[e.Register], e.Data))
		case *expr.Bitwise:
			words = append(words, fmt.Sprintf("& 0x%s ^ 0x%s", hex.EncodeToString(e.Mask), hex.EncodeToString(e.Xor)))
		case *expr.Immediate:
			words, loaded[e.Register] = append(words, describeData("", e.Data)), ""
		case *expr.Lookup:
			switch {
			case e.IsDestRegSet && e.DestRegister == 0:
				words = append(words, "vmap @"+e.SetName)
			case e.IsDestRegSet:
				words = append(words, "map @"+e.SetName)
			case e.Invert:
				words = append(words, "!= @"+e.SetName)
			default:
				words = append(words, "@"+e.SetName)
			}
		case *expr.Fib:
			what := "fib daddr type"
			if e.FlagSADDR {
				what = "fib saddr type"
			}
			words, loaded[e.Register] = append(words, what), "fib"
		case *expr.Numgen:
			words = append(words, fmt.Sprintf("numgen random mod %d offset %d", e.Modulus, e.Offset))
		case *expr.Dynset:
			words = append(words, "update @"+e.SetName)
		case *expr.Counter:
			words = append(words, "counter")
		case *expr.NAT:
			words = append(words, map[expr.NATType]string{expr.NATTypeDestNAT: "dnat", expr.NATTypeSourceNAT: "snat"}[e.Type])
		case *expr.Masq:
			words = append(words, "masquerade")
		case *expr.Reject:
			words = append(words, "reject")
		case *expr.Verdict:
			words = append(words, verdictResult(e.Kind, e.Chain, "").text)
		default:
			words = append(words, fmt.Sprintf("%T", e))
		}
	}
	return strings.Join(words, " ")
}

// isLoad reports whether e loads a packet's or its connection's field
// into a register.
func isLoad(e expr.Any) bool {
	switch e := e.(type) {
	case *expr.Payload:
		return true
	case *expr.Meta:
		return !e.SourceRegister
	case *expr.Ct:
		return !e.SourceRegister
	}
	return false
}

// describeData spells a comparison's data by what was loaded: an address,
// a protocol, a port, an interface name; else hex.
func describeData(loaded string, d []byte) string {
	switch {
	case strings.HasSuffix(loaded, "addr"):
		if a, ok := netip.AddrFromSlice(d); ok {
			return a.String()
		}
	case loaded == "meta l4proto" && len(d) == 1:
		return protoName(d[0])
	case loaded == "th dport" && len(d) == 2:
		return fmt.Sprint(binary.BigEndian.Uint16(d))
	case loaded == "iifname":
		return fmt.Sprintf("%q", strings.TrimRight(string(d), "\x00"))
	}
	return "0x" + hex.EncodeToString(d)
}
