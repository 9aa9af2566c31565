package nft

import (
	"strings"
	"testing"

	"github.com/kpproxy/kp/explain"
)

// FuzzRulePath feeds what the snapshot reader accepts to the nftables
// RulePather for a few packets: a damaged or hostile snapshot gets a path
// or says why it has none, never a panic.
func FuzzRulePath(f *testing.F) {
	f.Add(`{"format":"kp-snapshot/v1","mode":"nftables","services":{"generation":1,"servicePorts":[{"namespace":"default","name":"web",` +
		`"clusterIPs":["10.96.0.10"],"port":80,"protocol":"TCP","nodePort":30080,"endpoints":[{"ip":"10.244.1.10","port":8080,"ready":true,` +
		`"serving":true,"nodeName":"node-a"}]}],"node":{"name":"node-a","ips":["10.0.0.5"]},"serviceCIDRs":["10.96.0.0/16"]},` +
		`"proxy":{"localCIDRs":["10.244.0.0/16"],"nodePortIPs":["10.0.0.5"],"localAddresses":["10.0.0.5"]}}`)
	f.Add(`{"format":"kp-snapshot/v1","mode":"nftables","services":{"generation":1,"servicePorts":[{"clusterIPs":["::ffff:10.96.0.1"],` +
		`"port":-1,"protocol":"SCTP","endpoints":[{"ip":"10.0.0.1","port":70000}]}],"serviceCIDRs":["10.96.0.0/0"]},"proxy":{"nodePortIPs":["::"]}}`)
	f.Add(`{"format":"kp-snapshot/v1","mode":"nftables","services":{"generation":1,"servicePorts":[{"loadBalancerIPs":["1.2.3.4"],` +
		`"loadBalancerSourceRanges":["0.0.0.0/0"],"externalTrafficPolicy":"Local","sessionAffinitySeconds":-5}]},` +
		`"rules":[{"where":"nftables ip kp","format":"nft","text":"table ip kp {\n\tchain services {\n\t\tjump x # handle 1\n\t}\n}\n"}]}`)
	packets := [][2]string{{"10.96.0.10:80", "10.244.1.99"}, {"10.0.0.5:30080/udp", ""}, {"1.2.3.4:1/sctp", "1.2.3.5:9"},
		{"[fd00::10]:80", ""}, {"10.96.0.1:65535/sctp", "10.96.0.1"}}
	f.Fuzz(func(t *testing.T, data string) {
		snap, err := explain.ReadSnapshot(strings.NewReader(data))
		if err != nil {
			return
		}
		m, err := explain.FromSnapshot(snap)
		if err != nil {
			return
		}
		m.Mode = "nftables"
		for _, pk := range packets {
			p, err := explain.ParsePacket(pk[0], pk[1])
			if err != nil {
				continue
			}
			e := explain.Explain(m, p, explain.Options{RulePaths: map[string]explain.RulePather{"nftables": RulePather{}}})
			if len(e.RulePath.Steps) == 0 && e.RulePath.Absent == "" {
				t.Fatalf("%s: no path, and no word why", p)
			}
		}
	})
}
