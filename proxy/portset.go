package proxy

import (
	"iter"
	"maps"
)

// PortSet keeps the names of the service ports of a State that match a
// test of the ServicePort alone, from one State to the next without
// walking every Service: for consecutive generations only the ports in
// Changed are tested again. A gap of generations (a sync failed, and its
// snapshot consumed its changes) or an unrelated State tests them all.
//
// It is for what a sync asks of a few ports among many (those with a
// Local traffic policy, a health check port): at 10,000 Services, the
// walks of every Service that answered it took a fifth of kp's CPU under
// endpoint churn (test/bench/NOTES.md). A PortSet is not safe for
// concurrent use.
type PortSet struct {
	match func(*ServicePort) bool
	st    *State
	names map[ServicePortName]struct{}
}

// NewPortSet returns a PortSet of the ports that match.
func NewPortSet(match func(*ServicePort) bool) *PortSet {
	return &PortSet{match: match}
}

// Update brings the set to st's ports and returns them, in no order.
func (p *PortSet) Update(st *State) iter.Seq[ServicePortName] {
	switch {
	case st == p.st:
	case p.st != nil && st.Generation == p.st.Generation+1:
		for name := range st.Changed {
			p.test(name, st.Services[name])
		}
	default:
		p.names = make(map[ServicePortName]struct{})
		for name, sp := range st.Services {
			p.test(name, sp)
		}
	}
	p.st = st
	return maps.Keys(p.names)
}

// Len is the number of ports in the set after the last Update.
func (p *PortSet) Len() int { return len(p.names) }

func (p *PortSet) test(name ServicePortName, sp *ServicePort) {
	if sp != nil && p.match(sp) {
		p.names[name] = struct{}{}
		return
	}
	delete(p.names, name)
}
