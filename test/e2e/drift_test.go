package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// tampering is a change another process makes to kp's rules that breaks
// the web Service: the command, run in the node namespace, and what kp's
// log names of it.
type tampering struct {
	cmd     []string
	logged  []string // parts of kp's drift line
	byNamed bool     // the kernel names the process (nftables)
}

// tamperings are the changes TestRulesChangedByAnotherProcessAreRepairedWithinASecond
// makes in mode m, each in turn, to the web Service's rules (svcChain: the
// nftables mode's chain web:http's ClusterIP goes to).
func tamperings(m mode, svcChain string) []tampering {
	switch {
	case m.ipvs:
		return []tampering{{cmd: []string{"ipvsadm", "-D", "-t", webTCP},
			logged: []string{"virtual server tcp/" + webTCP + ": deleted"}}}
	case m.userspace && m.backend != "":
		return []tampering{{cmd: []string{"iptables-" + m.backend, "-t", "nat", "-F", "KP-USERSPACE-PORTALS"},
			logged: []string{"nat KP-USERSPACE-PORTALS: 0 rules"}}}
	case m.userspace:
		return []tampering{{cmd: []string{"nft", "delete", "element", "ip", "kp-userspace", "redirects", "{ 10.96.0.10 . tcp . 80 }"},
			logged: []string{"set redirects: 1 element, kp wrote 2"}}}
	case m.iptables():
		return []tampering{{cmd: []string{"iptables-" + m.backend, "-t", "nat", "-F", "KP-SERVICES"},
			logged: []string{"nat KP-SERVICES: 0 rules"}}}
	}
	return []tampering{
		{cmd: []string{"nft", "delete", "element", "ip", "kp", "service-slots", "{ 10.96.0.10 . tcp . 80 }"},
			logged: []string{"ip kp: deleted 1 element of set service-slots"}, byNamed: true},
		{cmd: []string{"nft", "flush", "chain", "ip", "kp", svcChain},
			logged: []string{"of chain " + svcChain}, byNamed: true},
	}
}

// TestRulesChangedByAnotherProcessAreRepairedWithinASecond: with the
// periodic resync turned off (a sync period of a year), another process
// breaks the web Service's rules (nft delete element, nft flush chain,
// iptables -F KP-SERVICES with the mode's iptables, ipvsadm -D, the
// userspace mode's redirect element or chain); kp notices, repairs them,
// and traffic resumes within a second (four in the VM); the change is
// logged with what changed (and, in nftables mode, which process), and
// kp_rules_drift_repairs_total{mode} counts each repair.
func TestRulesChangedByAnotherProcessAreRepairedWithinASecond(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 2)
		e.write("web.yaml", web(e.w.Pods()...))
		e.startKP("--sync-period", "8760h")
		e.answers(e.w.Client(), "tcp", webTCP)
		svcChain := ""
		if !m.rulesInIPTables() && !m.ipvs && !m.userspace {
			// web's ClusterIP is picked by the shared chains, which
			// every plain Service goes through first.
			c := regexp.MustCompile(`(?s)/web:http" : 0x.*chain (shared-pick) `).FindStringSubmatch(e.rules())
			if c == nil {
				t.Fatalf("no chain of web:http in kp's rules:\n%s", e.rules())
			}
			svcChain = c[1]
		}
		series := fmt.Sprintf(`kp_rules_drift_repairs_total{mode=%q}`, m.proxyMode)
		if v, ok := parseMetrics(e.metrics())[series]; !ok || v != 0 {
			t.Errorf("before any change by another process: %s = %v (present: %v), want 0: kp took its own writes for drift", series, v, ok)
		}
		for i, tm := range tamperings(m, svcChain) {
			if out, err := e.w.Exec(e.w.Node(), tm.cmd...); err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(tm.cmd, " "), err, out)
			}
			took, err := e.resumes(slow(time.Second))
			if err != nil {
				t.Fatalf("after %s: traffic did not resume within %v: %v", strings.Join(tm.cmd, " "), slow(time.Second), err)
			}
			t.Logf("after %s: traffic resumed after %v", strings.Join(tm.cmd, " "), took.Round(time.Millisecond))
			logged := append([]string{"changed by another process", m.proxyMode}, tm.logged...)
			if tm.byNamed {
				logged = append(logged, `nft (pid `)
			}
			e.logShows("the change logged", 5*time.Second, logged...)
			e.eventually(series+" counts the repair", 5*time.Second, func() error {
				if v := parseMetrics(e.metrics())[series]; v < float64(i+1) {
					return fmt.Errorf("%s = %v, want at least %d", series, v, i+1)
				}
				return nil
			})
		}
	})
}

// resumes polls web:http from the client with short tries until it
// answers or within passes; it returns how long that took. A try is short
// (a dropped SYN is sent again only after a second), so the time measured
// is the repair's, not the client's retry.
func (e *env) resumes(within time.Duration) (time.Duration, error) {
	start := time.Now()
	var err error
	for time.Since(start) < within {
		try := min(slow(150*time.Millisecond), within-time.Since(start))
		if _, err = e.w.Dial(e.w.Client(), "tcp", webTCP, try); err == nil {
			return time.Since(start), nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), err
}
