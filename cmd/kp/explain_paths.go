package main

import (
	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/legacy/ipvs"
	"github.com/kpproxy/kp/legacy/userspace"
	"github.com/kpproxy/kp/nft"
)

// rulePathers are the modes' RulePathers, by the mode name a snapshot
// reports: each tells a packet's path through its mode's rules.
var rulePathers = map[string]explain.RulePather{
	"nftables":  nft.RulePather{},
	"iptables":  iptables.RulePather{},
	"ipvs":      ipvs.RulePather{},
	"userspace": userspace.RulePather{},
}
