package explain

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzSnapshot feeds arbitrary bytes to the snapshot reader, and what it
// accepts to the explanation of a few packets: a damaged or hostile
// snapshot file is an error or an answer, never a panic.
func FuzzSnapshot(f *testing.F) {
	good, _ := json.Marshal(sampleSnapshot())
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(`{"format":"kp-snapshot/v1","services":{"generation":1,"servicePorts":[{"clusterIPs":["::ffff:10.96.0.1"],"port":-1,` +
		`"protocol":"SCTP","endpoints":[{"ip":"10.0.0.1","port":70000}]}],"serviceCIDRs":["10.96.0.0/0"]},"proxy":{"nodePortIPs":["::"]}}`))
	f.Add([]byte(`{"format":"kp-snapshot/v1","services":{"generation":1,"servicePorts":[{"loadBalancerIPs":["1.2.3.4"],` +
		`"loadBalancerSourceRanges":["0.0.0.0/0"],"externalTrafficPolicy":"Local","sessionAffinitySeconds":-5}]}}`))
	f.Add([]byte(`{"format":"kp-snapshot/v1","services":{"generation":1,"servicePorts":[{"namespace":"a","name":"b","protocol":"TCP",` +
		`"clusterIPs":["10.96.0.10"],"port":80,"sessionAffinitySeconds":10,"endpoints":[{"ip":"10.0.0.1","port":80,"ready":true}]}]},` +
		`"affinity":[{"namespace":"a","name":"b","protocol":"TCP","client":"10.244.1.99","endpoint":"10.0.0.1:80","frontend":"x",` +
		`"expiresSeconds":-9223372036854775808},{"namespace":"a","name":"b","protocol":"TCP","client":"10.244.1.99",` +
		`"endpoint":"10.0.0.1:80","traffic":"external","expiresSeconds":9223372036854775807},{"name":"c","client":"::ffff:10.244.1.99","endpoint":"[::]:0"}],"affinityError":"x"}`))
	packets := [][2]string{{"10.96.0.10:80", "10.244.1.99"}, {"10.96.0.10:80", "10.244.1.99:4000"}, {"10.0.0.5:30080/udp", ""}, {"1.2.3.4:0/sctp", "1.2.3.5:9"},
		{"[fd00::10]:80", ""}, {"10.96.0.1:65535/sctp", "10.96.0.1"}}
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := ReadSnapshot(strings.NewReader(string(data)))
		if err != nil {
			return
		}
		m, err := FromSnapshot(snap)
		if err != nil {
			return
		}
		for _, pk := range packets {
			p, err := ParsePacket(pk[0], pk[1])
			if err != nil {
				continue
			}
			e := Explain(m, p, Options{Version: "v0"})
			if e.Verdict == "" {
				t.Fatalf("%s: no verdict", p)
			}
			var sb strings.Builder
			if err := Write(&sb, e); err != nil {
				t.Fatal(err)
			}
		}
	})
}
