package e2e

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/kpproxy/kp/explain"
)

func stepLines(steps []explain.RuleStep) string {
	var b strings.Builder
	for _, s := range steps {
		b.WriteString(s.Where + ": " + s.Verdict + "\n")
	}
	return b.String()
}

// xtables-monitor's trace of a pod's packet: the bridge gives it another
// trace id from FORWARD on; a retransmission (another IP ID) and the rules
// of chains not kp's are left out; RETURN comes as NFT_RETURN's number.
func TestParseXtablesTraceFollowsThePacket(t *testing.T) {
	const trace = `PACKET: 2 470d892b IN=kpbr0 SRC=10.100.1.10 DST=203.0.113.99 LEN=60 ID=39728 DF SPORT=33784 DPORT=80 SYN 
 TRACE: 2 470d892b raw:PREROUTING:rule:0x5:CONTINUE  -4 -t raw -A PREROUTING -s 10.100.1.10/32 -j TRACE
 TRACE: 2 470d892b raw:PREROUTING:policy:ACCEPT 
PACKET: 2 470d892b IN=kpbr0 SRC=10.100.1.10 DST=203.0.113.99 LEN=60 ID=39728 DF SPORT=33784 DPORT=80 SYN 
 TRACE: 2 470d892b nat:PREROUTING:rule:0x6e:JUMP:KP-SERVICES  -4 -t nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KP-SERVICES
 TRACE: 2 470d892b nat:KP-SERVICES:return: 
PACKET: 2 5ddc64bd IN=kpbr0 OUT=kpc0 SRC=10.100.1.10 DST=203.0.113.99 LEN=60 ID=39728 DF SPORT=33784 DPORT=80 SYN 
 TRACE: 2 5ddc64bd filter:FORWARD:rule:0x24:JUMP:KP-FORWARD  -4 -t filter -A FORWARD -m comment --comment "kubernetes forwarding rules" -j KP-FORWARD
 TRACE: 2 5ddc64bd filter:FORWARD:rule:0x25:ACCEPT  -4 -t filter -A FORWARD -j ACCEPT
PACKET: 2 5ddc64bd IN=kpbr0 OUT=kpc0 SRC=10.100.1.10 DST=203.0.113.99 LEN=60 ID=39728 DF SPORT=33784 DPORT=80 SYN 
 TRACE: 2 5ddc64bd nat:POSTROUTING:rule:0x70:JUMP:KP-POSTROUTING  -4 -t nat -A POSTROUTING -j KP-POSTROUTING
 TRACE: 2 5ddc64bd nat:KP-POSTROUTING:rule:0x29:0xfffffffb  -4 -t nat -A KP-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
PACKET: 2 11111111 IN=kpbr0 SRC=10.100.1.10 DST=203.0.113.99 LEN=60 ID=39999 DF SPORT=33784 DPORT=80 SYN 
 TRACE: 2 11111111 nat:PREROUTING:rule:0x6e:JUMP:KP-SERVICES  -4 -t nat -A PREROUTING -j KP-SERVICES`
	steps, err := parseXtablesTrace(trace)
	if err != nil {
		t.Fatal(err)
	}
	want := "nat PREROUTING: jump KP-SERVICES\nfilter FORWARD: jump KP-FORWARD\nnat POSTROUTING: jump KP-POSTROUTING\nnat KP-POSTROUTING: return\n"
	if got := stepLines(steps); got != want {
		t.Errorf("got\n%swant\n%s", got, want)
	}
	if steps[0].Handle != 0x6e || !strings.HasPrefix(steps[0].Rule, "-A PREROUTING ") {
		t.Errorf("first step %+v: want handle 0x6e and the rule's text", steps[0])
	}
}

// The counters' walk: hooks in order, into the chains counted rules jump
// to, stopping at a terminal verdict; a rule only a later packet of the
// flow can match (ESTABLISHED) does not count, nor other programs' rules,
// nor a hook the packet did not meet (INPUT, for a forwarded packet).
func TestWalkCountedFollowsEvaluationOrder(t *testing.T) {
	nat := parseCounted(`*nat
[0:0] -A PREROUTING -j OTHER
[1:60] -A PREROUTING -m comment --comment "kubernetes service portals" -j KP-SERVICES
[1:60] -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KP-POSTROUTING
[1:60] -A KP-SERVICES -d 10.96.0.11/32 -p tcp -m tcp --dport 80 -j KP-SVC-X
[1:60] -A KP-SVC-X -j KP-MARK-MASQ
[1:60] -A KP-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
[1:60] -A KP-SVC-X -j KP-SEP-A
[1:60] -A KP-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.100.1.11:8080
[0:0] -A KP-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
[1:60] -A KP-POSTROUTING -j MARK --set-xmark 0x4000/0x0
[1:60] -A KP-POSTROUTING -j MASQUERADE --random-fully
COMMIT
`)
	filter := parseCounted(`*filter
[1:60] -A FORWARD -j ACCEPT
[2:120] -A FORWARD -m comment --comment "kubernetes forwarding rules" -j KP-FORWARD
[1:60] -A KP-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
[1:60] -A KP-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
[1:60] -A FORWARD -m conntrack --ctstate NEW -j KP-SERVICES
[1:60] -A INPUT -j KP-NODEPORTS
COMMIT
`)
	local := func(a netip.Addr) bool { return a == netip.MustParseAddr("10.100.2.1") }
	steps := walkCounted(map[string]map[string][]countedRule{"nat": nat, "filter": filter},
		counterPath{dst: netip.MustParseAddr("10.96.0.11"), local: local})
	want := `nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump KP-SVC-X
nat KP-SVC-X: jump KP-MARK-MASQ
nat KP-MARK-MASQ: continue
nat KP-SVC-X: jump KP-SEP-A
nat KP-SEP-A: dnat to 10.100.1.11:8080
filter FORWARD: jump KP-FORWARD
filter KP-FORWARD: accept
nat POSTROUTING: jump KP-POSTROUTING
nat KP-POSTROUTING: continue
nat KP-POSTROUTING: masquerade
`
	if got := stepLines(steps); got != want {
		t.Errorf("got\n%swant\n%s", got, want)
	}
}
