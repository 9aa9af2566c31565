package nft

import (
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/kpproxy/kp/proxy"
)

// TableName is the name of kp's table in both the ip and ip6 families.
const TableName = "kp"

// family is one of the two tables kp owns.
type family struct {
	v6   bool
	name string // "ip" or "ip6", as nft spells the table family
	nf   nftables.TableFamily
	pf   proxy.Family
}

var (
	familyIPv4 = family{v6: false, name: "ip", nf: nftables.TableFamilyIPv4, pf: proxy.IPv4}
	familyIPv6 = family{v6: true, name: "ip6", nf: nftables.TableFamilyIPv6, pf: proxy.IPv6}
	families   = []family{familyIPv4, familyIPv6}
)

func (f family) addrType() nftables.SetDatatype {
	if f.v6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

// Hook makes a chain a base chain.
type Hook struct {
	Type     nftables.ChainType
	Hook     *nftables.ChainHook
	Priority int32
	HookName string // for String(): prerouting, output, ...
}

// Chain is a chain with its complete contents.
type Chain struct {
	Name  string
	Hook  *Hook
	Rules []Rule
}

// digest identifies a chain's contents for bookkeeping: two chains with the
// same digest need no rewrite. It is a hash (never 0, which means unknown),
// as kp keeps one per chain between syncs.
func (c *Chain) digest() uint64 {
	h := fnv.New64a()
	if c.Hook != nil {
		fmt.Fprintf(h, "hook %s %s %d;", c.Hook.Type, c.Hook.HookName, c.Hook.Priority)
	}
	for i := range c.Rules {
		io.WriteString(h, c.Rules[i].String())
		h.Write([]byte{'\n'})
	}
	return max(h.Sum64(), 1)
}

// Set is a named set or verdict map.
type Set struct {
	Name     string
	KeyType  nftables.SetDatatype
	Concat   bool
	VMap     bool // a verdict map
	Interval bool
	// Dynamic sets are filled by the packet path (update @set) and their
	// elements expire after Timeout; kp never writes or diffs their
	// elements (session affinity).
	Dynamic bool
	Timeout time.Duration
	// DataType makes the set a map to plain data (the endpoint map's
	// address . port), not to verdicts.
	DataType nftables.SetDatatype
	// Counter gives every element its own counter, which the kernel
	// updates on each lookup that finds the element.
	Counter bool
	// KeyHostOrder tells nft the key is in host byte order (a mark), so
	// that it lists keys as the numbers they are.
	KeyHostOrder bool
	// DataHostOrder tells nft a data map's values are in host byte order
	// (marks), so that it lists them as the numbers they are, and a
	// listing reloads as it was.
	DataHostOrder bool
	Comment       string
}

// digest identifies what of a set's declaration can change while its name
// stays: a set whose digest changed is deleted and declared again.
func (s *Set) digest() string {
	return fmt.Sprintf("dynamic=%t timeout=%s", s.Dynamic, s.Timeout)
}

// Element is one element of a named set or verdict map. Key is the raw
// kernel encoding; KeyText its nft spelling.
//
// Its size is kept at or under 128 bytes: a Go map holds a larger value
// out of line, one allocation per element put (objects hold elements by
// value, and a full sync puts hundreds of thousands).
type Element struct {
	Key     []byte
	KeyText string
	// Verdict and Chain are a verdict map's value: "goto Chain", "jump
	// Chain" (the rule after the lookup runs on return), or "drop".
	Chain   string
	Verdict verdict
	KeyEnd  bool // interval end marker (interval sets only)
	// Data is a data map's value (raw kernel encoding), DataText its nft
	// spelling.
	Data     []byte
	DataText string
	Comment  string
}

// verdict is a verdict map element's verdict kind.
type verdict uint8

const (
	verdictNone verdict = iota
	verdictGoto
	verdictJump
	verdictDrop
)

// value is the element's verdict as kp records it: "goto CHAIN", "jump
// CHAIN", "drop", or "" in a plain set.
func (e *Element) value() string {
	switch {
	case e.Verdict == verdictDrop:
		return "drop"
	case e.Verdict == verdictGoto:
		return "goto " + e.Chain
	case e.Verdict == verdictJump:
		return "jump " + e.Chain
	case e.Data != nil:
		return "data " + hex.EncodeToString(e.Data)
	}
	return ""
}

// digest identifies the element's value as kp keeps it in its record of
// the kernel (a hash of value: kp keeps one per element between syncs).
func (e *Element) digest() uint64 {
	// FNV-1a of what value spells, without spelling it: diff takes the
	// digest of every element of a full sync.
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	add := func(b byte) { h = (h ^ uint64(b)) * prime }
	add(byte(e.Verdict))
	if e.Verdict != verdictNone {
		for i := 0; i < len(e.Chain); i++ {
			add(e.Chain[i])
		}
		return h
	}
	if e.Data != nil {
		add(1)
		for _, b := range e.Data {
			add(b)
		}
	}
	return h
}

// elementOfKey is the element of set kp knows only by its key (to delete
// it).
func elementOfKey(set, id string) Element {
	return Element{Key: keyBytes(id), KeyEnd: isEndKey(id), KeyText: keyTextOf(set, id)}
}

type opKind int

const (
	opAddTable opKind = iota
	opAddSet
	opDelSet
	opAddChain
	opFlushChain
	opAddRule
	opDelElement
	opAddElement
	opDelChain
	opDelCounter
	opDelTable
)

type op struct {
	kind  opKind
	fam   family
	chain *Chain // add/flush/del chain
	rule  *Rule  // add rule (chain in chain)
	set   *Set   // add set; element ops name the set
	elems []Element
	name  string // counter name
}

// Transaction is a batch of changes applied atomically in one netlink batch.
type Transaction struct {
	ops []op
	// stream, when set, takes the operations spill hands it (a batch
	// being encoded): a full sync spills after each Service, so that no
	// more than one Service's rendered rules wait to be encoded.
	stream  opStream
	spilled int
	// spare are element lists the batch encoder is done with, for the next
	// group's diff to fill (elementsFor): a full sync's lists were a
	// good part of what it allocated (test/bench/NOTES.md).
	spare [][]Element
}

// maxSpare bounds the element lists a transaction keeps for reuse: one for
// each set a group of Services fills is plenty.
const maxSpare = 8

// elementsFor returns an empty element list with room for n, a spare one
// when one is large enough.
func (tx *Transaction) elementsFor(n int) []Element {
	for i, s := range tx.spare {
		if cap(s) >= n {
			tx.spare = append(tx.spare[:i], tx.spare[i+1:]...)
			return s
		}
	}
	return make([]Element, 0, n)
}

// opStream takes a transaction's operations as they are made.
type opStream interface {
	add(o *op) error
	close()
}

// spill hands the operations made so far to the stream, if any, and
// forgets them.
func (tx *Transaction) spill() error {
	if tx.stream == nil {
		return nil
	}
	_, encoder := tx.stream.(*batchEncoder) // it keeps no operation once encoded
	for i := range tx.ops {
		o := &tx.ops[i]
		if err := tx.stream.add(o); err != nil {
			return err
		}
		if encoder && o.elems != nil && len(tx.spare) < maxSpare {
			clear(o.elems)
			tx.spare = append(tx.spare, o.elems[:0])
		}
	}
	tx.spilled += len(tx.ops)
	clear(tx.ops)
	tx.ops = tx.ops[:0]
	return nil
}

// discard releases a stream that will not be applied.
func (tx *Transaction) discard() {
	if tx.stream != nil {
		tx.stream.close()
		tx.stream = nil
	}
}

func (tx *Transaction) addTable(f family) { tx.ops = append(tx.ops, op{kind: opAddTable, fam: f}) }
func (tx *Transaction) delTable(f family) { tx.ops = append(tx.ops, op{kind: opDelTable, fam: f}) }
func (tx *Transaction) addSet(f family, s *Set) {
	tx.ops = append(tx.ops, op{kind: opAddSet, fam: f, set: s})
}
func (tx *Transaction) delSet(f family, s *Set) {
	tx.ops = append(tx.ops, op{kind: opDelSet, fam: f, set: s})
}
func (tx *Transaction) delCounter(f family, n string) {
	tx.ops = append(tx.ops, op{kind: opDelCounter, fam: f, name: n})
}
func (tx *Transaction) addChain(f family, c *Chain) {
	tx.ops = append(tx.ops, op{kind: opAddChain, fam: f, chain: c})
}
func (tx *Transaction) flushChain(f family, c *Chain) {
	tx.ops = append(tx.ops, op{kind: opFlushChain, fam: f, chain: c})
}
func (tx *Transaction) delChain(f family, c *Chain) {
	tx.ops = append(tx.ops, op{kind: opDelChain, fam: f, chain: c})
}
func (tx *Transaction) addRule(f family, c *Chain, r *Rule) {
	tx.ops = append(tx.ops, op{kind: opAddRule, fam: f, chain: c, rule: r})
}
func (tx *Transaction) addElements(f family, set *Set, es []Element) {
	if len(es) > 0 {
		tx.ops = append(tx.ops, op{kind: opAddElement, fam: f, set: set, elems: es})
	}
}
func (tx *Transaction) delElements(f family, set *Set, es []Element) {
	if len(es) > 0 {
		tx.ops = append(tx.ops, op{kind: opDelElement, fam: f, set: set, elems: es})
	}
}

// Len is the number of operations; a sync with nothing to do has none.
func (tx *Transaction) Len() int { return tx.spilled + len(tx.ops) }

// String prints the transaction as an nft script, for logs and test output
// (what a stream took is not printed).
func (tx *Transaction) String() string {
	var sb strings.Builder
	for i := range tx.ops {
		tx.ops[i].write(&sb)
	}
	return sb.String()
}

// describe is the operation's first line in nft syntax (with the number of
// elements it holds), for error messages.
func (o *op) describe() string {
	var sb strings.Builder
	o.write(&sb)
	s, _, _ := strings.Cut(sb.String(), "\n")
	if len(o.elems) > 1 {
		s = fmt.Sprintf("%s and %d more elements", s, len(o.elems)-1)
	}
	return s
}

// write prints the operation in nft syntax, one line per element.
func (o *op) write(sb *strings.Builder) {
	t := fmt.Sprintf("%s %s", o.fam.name, TableName)
	switch o.kind {
	case opAddTable:
		fmt.Fprintf(sb, "add table %s\n", t)
	case opDelTable:
		fmt.Fprintf(sb, "delete table %s\n", t)
	case opAddSet:
		kind := "set"
		if o.set.VMap {
			kind = "map"
		}
		fmt.Fprintf(sb, "add %s %s %s\n", kind, t, o.set.Name)
	case opDelSet:
		fmt.Fprintf(sb, "delete set %s %s\n", t, o.set.Name)
	case opDelCounter:
		fmt.Fprintf(sb, "delete counter %s %s\n", t, o.name)
	case opAddChain:
		fmt.Fprintf(sb, "add chain %s %s\n", t, o.chain.Name)
	case opFlushChain:
		fmt.Fprintf(sb, "flush chain %s %s\n", t, o.chain.Name)
	case opDelChain:
		fmt.Fprintf(sb, "delete chain %s %s\n", t, o.chain.Name)
	case opAddRule:
		fmt.Fprintf(sb, "add rule %s %s %s\n", t, o.chain.Name, o.rule.String())
	case opAddElement, opDelElement:
		verb := "add"
		if o.kind == opDelElement {
			verb = "delete"
		}
		for _, e := range o.elems {
			v := e.value()
			if e.DataText != "" {
				v = e.DataText
			}
			if v != "" && o.kind == opAddElement {
				fmt.Fprintf(sb, "%s element %s %s { %s : %s }\n", verb, t, o.set.Name, e.KeyText, v)
			} else {
				fmt.Fprintf(sb, "%s element %s %s { %s }\n", verb, t, o.set.Name, e.KeyText)
			}
		}
	}
}

// keyText spells a concatenated key as nft does.
func keyText(parts ...string) string { return strings.Join(parts, " . ") }

func addrKey(a netip.Addr) []byte { return a.AsSlice() }
