// Package migrate takes a node over from whatever programmed its Services
// before kp's current mode: upstream kube-proxy in any mode, or kp in
// another mode. It finds their rules and, once kp's own first sync has
// succeeded (never before: no moment with neither), removes them, and only
// them: another program's chains, rules, tables and sets are never
// touched, even when they reference kube-proxy's.
package migrate
