package conntrack

import "github.com/kpproxy/kp/proxy"

// cleanedCount keeps how many UDP and SCTP service ports the last State
// the cleaner saw has, so that a sync asks "is there anything of a cleaned
// protocol?" without walking every Service: from one snapshot to the next
// (consecutive generations) only the service ports in Changed can differ.
// A gap of generations (a sync failed, whose snapshot consumed its changes)
// or another State counts all again. At 10,000 TCP-only Services the walks
// of the previous and the current State were 11 % of kp's CPU under
// churn (test/bench/NOTES.md).
type cleanedCount struct {
	st *proxy.State
	n  int
}

// ports returns the UDP and SCTP service ports of prev and of cur, and
// remembers cur's.
func (c *cleanedCount) ports(prev, cur *proxy.State) (prevN, curN int) {
	if prev != nil {
		if prev == c.st {
			prevN = c.n
		} else {
			prevN = countCleaned(prev)
		}
	}
	if cur == nil {
		return prevN, 0
	}
	switch {
	case cur == c.st:
		curN = c.n
	case prev != nil && prev == c.st && cur.Generation == prev.Generation+1:
		curN = prevN
		for name := range cur.Changed {
			curN += isCleaned(cur.Services[name]) - isCleaned(prev.Services[name])
		}
	default:
		curN = countCleaned(cur)
	}
	c.st, c.n = cur, curN
	return prevN, curN
}

// countCleaned counts st's UDP and SCTP service ports.
func countCleaned(st *proxy.State) int {
	n := 0
	for _, sp := range st.Services {
		n += isCleaned(sp)
	}
	return n
}

// isCleaned is 1 for a UDP or SCTP service port, else 0 (nil too).
func isCleaned(sp *proxy.ServicePort) int {
	if sp != nil && cleaned(proxy.ProtocolNumber(sp.Protocol)) {
		return 1
	}
	return 0
}
