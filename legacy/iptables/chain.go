package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// Rule is one iptables rule of a chain, as iptables-restore reads it after
// "-A CHAIN": Args are the matches and the target; Comment, when set, goes
// first as "-m comment --comment". Owner is the service port the rule was
// rendered for (zero for kp's static rules), so that a line iptables-restore
// refuses names its Service.
type Rule struct {
	Comment string
	Args    string
	Owner   proxy.ServicePortName
}

// Chain is one chain kp owns, with its rules in order.
type Chain struct {
	Table Table
	Name  string
	Rules []Rule
	// sum caches digest: a service port's chains are kept between syncs
	// and compared at every one. Rules must not change once it is set.
	sum string
	// rules is len(Rules) of a compacted chain, whose Rules were dropped
	// once the kernel held them (book.compact).
	rules int
}

// ruleCount is the number of rules the chain has in the kernel.
func (c *Chain) ruleCount() int {
	if c.Rules == nil {
		return c.rules
	}
	return len(c.Rules)
}

// compact drops the rules of a chain the kernel holds, keeping its digest
// and rule count (book.compact).
func (c *Chain) compact() {
	if c.Rules == nil {
		return
	}
	c.digest()
	c.rules, c.Rules = len(c.Rules), nil
}

// String prints the rule as a line of iptables-restore input.
func (r Rule) line(chain string) string {
	var b strings.Builder
	b.WriteString("-A ")
	b.WriteString(chain)
	if r.Comment != "" {
		b.WriteString(" -m comment --comment ")
		b.WriteString(quote(r.Comment))
	}
	if r.Args != "" {
		b.WriteString(" ")
		b.WriteString(r.Args)
	}
	return b.String()
}

// digest identifies the chain's contents: two chains with the same digest
// print the same restore input.
func (c *Chain) digest() string {
	if c.sum != "" {
		return c.sum
	}
	h := sha256.New()
	for _, r := range c.Rules {
		h.Write([]byte(r.line(c.Name)))
		h.Write([]byte{'\n'})
	}
	c.sum = string(h.Sum(nil))
	return c.sum
}

// quote makes s one argument of iptables-restore's line parser, which
// splits on spaces outside double quotes and has no escapes inside them:
// Kubernetes names hold no quote, and a comment is cut to xtables' 256
// bytes.
func quote(s string) string {
	s = strings.ReplaceAll(s, `"`, "'")
	if len(s) > 255 {
		s = s[:255]
	}
	return `"` + s + `"`
}

// hash16 is upstream's chain-name hash: the first 16 characters of the
// base32 SHA-256 of s, so names stay within iptables' 28 characters.
func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// Names of kp's static chains: upstream's, with a KP- prefix.
const (
	chainServices         = "KP-SERVICES"
	chainExternalServices = "KP-EXTERNAL-SERVICES"
	chainNodePorts        = "KP-NODEPORTS"
	chainPostrouting      = "KP-POSTROUTING"
	chainMarkMasq         = "KP-MARK-MASQ"
	chainForward          = "KP-FORWARD"
	chainProxyFirewall    = "KP-PROXY-FIREWALL"
	chainFirewall         = "KP-FIREWALL"
	chainClusterIPsCheck  = "KP-CLUSTER-IPS-CHECK"
)

// isKPChain reports whether name is one of the iptables mode's chains: a
// KP- chain that is not another mode's (owned.go, IPVSChainPrefix).
func isKPChain(name string) bool { return strings.HasPrefix(name, "KP-") && !ownedByOther(name) }

// IPVSChainPrefix starts the name of every chain of the ipvs mode, which
// writes its iptables part through this package: KP- chains that the
// iptables mode neither rewrites nor removes, and whose removal
// (CleanupChains) leaves the iptables mode's alone.
const IPVSChainPrefix = "KP-IPVS-"

// Line prints the rule as a line of iptables-restore input appending it to
// chain (for the ipvs mode's chains).
func (r Rule) Line(chain string) string { return r.line(chain) }

// Per-service-port chain names, as upstream's: a hash of the service port
// name and protocol (and endpoint for KP-SEP-).
func svcHash(sp *proxy.ServicePort) string {
	return hash16(sp.Name.String() + strings.ToLower(string(sp.Protocol)))
}

func svcChainName(sp *proxy.ServicePort) string { return "KP-SVC-" + svcHash(sp) }
func svlChainName(sp *proxy.ServicePort) string { return "KP-SVL-" + svcHash(sp) }
func extChainName(sp *proxy.ServicePort) string { return "KP-EXT-" + svcHash(sp) }
func fwChainName(sp *proxy.ServicePort) string  { return "KP-FW-" + svcHash(sp) }
func sepChainName(sp *proxy.ServicePort, e proxy.Endpoint) string {
	return "KP-SEP-" + hash16(sp.Name.String()+strings.ToLower(string(sp.Protocol))+e.String())
}
