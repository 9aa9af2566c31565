package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

func TestWriteOwnedKeepsExactlyItsChainsAndJumpsAndNothingElse(t *testing.T) {
	const p = UserspaceChainPrefix
	portals := func(rules ...string) *Chain {
		c := &Chain{Table: TableNAT, Name: p + "PORTALS"}
		for _, r := range rules {
			c.Rules = append(c.Rules, Rule{Comment: "demo/web", Args: r})
		}
		return c
	}
	jumps := []Jump{
		{Table: TableNAT, From: "PREROUTING", To: p + "PORTALS", Comment: "kp userspace portals"},
		{Table: TableNAT, From: "OUTPUT", To: p + "PORTALS", Comment: "kp userspace portals"},
		{Table: TableFilter, From: "INPUT", To: p + "SERVICES", Comment: "kp userspace services", Match: "-m conntrack --ctstate NEW"},
	}
	services := &Chain{Table: TableFilter, Name: p + "SERVICES", Rules: []Rule{{Comment: "demo/empty", Args: "-d 10.96.0.12/32 -j REJECT"}}}
	fk := NewFake(FlavorLegacy, proxy.IPv4)
	// The iptables mode's chain and an operator's rule stay whatever
	// WriteOwned does.
	if err := fk.Restore(context.Background(), []byte("*nat\n:KP-SERVICES - [0:0]\n-A PREROUTING -j KP-SERVICES\n-A KP-SERVICES -d 10.0.0.1/32 -j RETURN\n-A OUTPUT -d 192.0.2.0/24 -j RETURN\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	write := func(o OwnedRules) {
		t.Helper()
		if err := WriteOwned(context.Background(), fk, o); err != nil {
			t.Fatalf("WriteOwned: %v", err)
		}
	}
	for _, step := range []struct {
		name   string
		before func()
		o      OwnedRules
		nat    string
		filter string
	}{
		{"first write: chains and jumps, first in the built-in chains",
			nil,
			OwnedRules{Prefix: p, Chains: []*Chain{portals("-d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 40001"), services}, Jumps: jumps},
			`PREROUTING: -m comment --comment "kp userspace portals" -j KP-USERSPACE-PORTALS
PREROUTING: -j KP-SERVICES
OUTPUT: -m comment --comment "kp userspace portals" -j KP-USERSPACE-PORTALS
OUTPUT: -d 192.0.2.0/24 -j RETURN
KP-SERVICES: -d 10.0.0.1/32 -j RETURN
KP-USERSPACE-PORTALS: -m comment --comment "demo/web" -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 40001`,
			`INPUT: -m conntrack --ctstate NEW -m comment --comment "kp userspace services" -j KP-USERSPACE-SERVICES
KP-USERSPACE-SERVICES: -m comment --comment "demo/empty" -d 10.96.0.12/32 -j REJECT`},
		{"a rewrite: the chain's rules replaced, the jumps not doubled; a duplicated jump and a stray one deleted",
			func() {
				in := "*nat\n:KP-USERSPACE-OLD - [0:0]\n-A OUTPUT -m comment --comment \"kp userspace portals\" -j KP-USERSPACE-PORTALS\n-A PREROUTING -j KP-USERSPACE-OLD\nCOMMIT\n"
				if err := fk.Restore(context.Background(), []byte(in)); err != nil {
					t.Fatal(err)
				}
			},
			OwnedRules{Prefix: p, Chains: []*Chain{portals("-d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 40002")}, Jumps: jumps[:2]},
			`PREROUTING: -m comment --comment "kp userspace portals" -j KP-USERSPACE-PORTALS
PREROUTING: -j KP-SERVICES
OUTPUT: -m comment --comment "kp userspace portals" -j KP-USERSPACE-PORTALS
OUTPUT: -d 192.0.2.0/24 -j RETURN
KP-SERVICES: -d 10.0.0.1/32 -j RETURN
KP-USERSPACE-PORTALS: -m comment --comment "demo/web" -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 40002`,
			``},
		{"nothing owned: every chain and jump of the owner's gone",
			nil,
			OwnedRules{Prefix: p},
			`PREROUTING: -j KP-SERVICES
OUTPUT: -d 192.0.2.0/24 -j RETURN
KP-SERVICES: -d 10.0.0.1/32 -j RETURN`,
			``},
	} {
		t.Run(step.name, func(t *testing.T) {
			if step.before != nil {
				step.before()
			}
			write(step.o)
			if got := fk.Dump(TableNAT); got != step.nat {
				t.Errorf("nat:\n%s\nwant\n%s\n(input:\n%s)", got, step.nat, fk.Inputs[len(fk.Inputs)-1])
			}
			if got := fk.Dump(TableFilter); got != step.filter {
				t.Errorf("filter:\n%s\nwant\n%s", got, step.filter)
			}
			for _, tb := range []Table{TableNAT, TableFilter} {
				for _, c := range fk.Tables[tb].Chains {
					if strings.HasPrefix(c, p) && !strings.Contains(step.nat+step.filter, c+":") {
						t.Errorf("chain %s %s is still declared", tb, c)
					}
				}
			}
		})
	}
	n := len(fk.Inputs)
	write(OwnedRules{Prefix: p})
	if len(fk.Inputs) != n {
		t.Errorf("writing what the kernel holds ran iptables-restore:\n%s", fk.Inputs[n])
	}
}

func TestWriteOwnedRefusesChainsOutsideItsPrefix(t *testing.T) {
	fk := NewFake(FlavorNFT, proxy.IPv4)
	for _, o := range []OwnedRules{
		{Prefix: "KP-"},
		{Prefix: UserspaceChainPrefix, Chains: []*Chain{{Table: TableNAT, Name: "KP-SERVICES"}}},
	} {
		if err := WriteOwned(context.Background(), fk, o); err == nil {
			t.Errorf("WriteOwned(%+v) accepted", o)
		}
	}
}

func TestTheIPTablesModeLeavesTheOtherModesChainsAlone(t *testing.T) {
	for name, want := range map[string]bool{
		"KP-SERVICES": true, "KP-SVC-ABC": true, "KP-USERSPACE-PORTALS": false, "KUBE-SERVICES": false,
	} {
		if isKPChain(name) != want {
			t.Errorf("isKPChain(%s) = %v, want %v", name, !want, want)
		}
	}
}

func TestWriteOwnedKeepsItsJumpsInItsOrder(t *testing.T) {
	const p = UserspaceChainPrefix
	o := OwnedRules{Prefix: p,
		Chains: []*Chain{{Table: TableFilter, Name: p + "A"}, {Table: TableFilter, Name: p + "B"}},
		Jumps: []Jump{
			{Table: TableFilter, From: "FORWARD", To: p + "A", Comment: "first"},
			{Table: TableFilter, From: "FORWARD", To: p + "B", Comment: "second"},
		}}
	fk := NewFake(FlavorLegacy, proxy.IPv4)
	want := "FORWARD: -m comment --comment \"first\" -j KP-USERSPACE-A\nFORWARD: -m comment --comment \"second\" -j KP-USERSPACE-B"
	for _, step := range []struct{ name, before string }{
		{"first write", ""},
		{"one jump lost", "*filter\n-D FORWARD -m comment --comment \"first\" -j KP-USERSPACE-A\nCOMMIT\n"},
		{"swapped", "*filter\n-D FORWARD -m comment --comment \"first\" -j KP-USERSPACE-A\n-A FORWARD -m comment --comment \"first\" -j KP-USERSPACE-A\nCOMMIT\n"},
	} {
		if step.before != "" {
			if err := fk.Restore(context.Background(), []byte(step.before)); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
		}
		if err := WriteOwned(context.Background(), fk, o); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := fk.Dump(TableFilter); got != want {
			t.Errorf("%s: filter\n%s\nwant\n%s", step.name, got, want)
		}
	}
}
