package ipvs

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
)

// ipvsConnSample is /proc/net/ip_vs_conn with, for client 10.244.2.99: a
// template of the ClusterIP 10.96.0.11:80 to 10.244.1.2:8080, the
// connection it placed, a template of NodePort 30080 on 192.168.1.5, one
// of a Service without affinity's address, and an IPv6 template.
const ipvsConnSample = `Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP 0AF40263 0000 0A60000B 0050 0AF40102 1F90 NONE           3599
TCP 0AF40263 9C40 0A60000B 0050 0AF40102 1F90 TIME_WAIT        98
TCP 0AF40263 0000 C0A80105 7580 0AF40103 1F90 NONE           3000
TCP 0AF40263 0000 0A60000C 0050 0AF40104 1F90 NONE             10
UDP fd00:0000:0000:0000:0000:0000:0000:0099 0000 fd00:0000:0000:0000:0000:0000:0096:000b 0035 fd00:0000:0000:0000:0000:0000:0244:0002 0035 NONE  50
IP  0AF40263 0000 00000000 0000 0AF40102 0000 NONE             20
`

func TestTemplatesAreTheAffinityEntriesOfTheirServicePort(t *testing.T) {
	conns, err := parseIPVSConn(strings.NewReader(ipvsConnSample))
	if err != nil {
		t.Fatal(err)
	}
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	dns := statetest.PortName("demo", "dns", "", v1.ProtocolUDP)
	plain := statetest.PortName("demo", "plain", "", v1.ProtocolTCP)
	s := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{
		web:   {Name: web, ClusterIPs: proxytest.Addrs("10.96.0.11"), Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP, AffinityTimeout: time.Hour},
		dns:   {Name: dns, ClusterIPs: proxytest.Addrs("fd00::96:b"), Port: 53, Protocol: v1.ProtocolUDP, AffinityTimeout: time.Minute},
		plain: {Name: plain, ClusterIPs: proxytest.Addrs("10.96.0.12"), Port: 80, Protocol: v1.ProtocolTCP},
	}}
	var got []string
	for _, e := range templateEntries(s, conns) {
		got = append(got, e.ServicePort.String()+" "+e.Client.String()+" -> "+e.Endpoint.String()+" via "+e.Frontend.String()+" "+e.Expires.String())
	}
	want := []string{
		"demo/web:http 10.244.2.99 -> 10.244.1.2:8080 via 10.96.0.11:80 59m59s",
		"demo/web:http 10.244.2.99 -> 10.244.1.3:8080 via 192.168.1.5:30080 50m0s",
		"demo/dns fd00::99 -> [fd00::244:2]:53 via [fd00::96:b]:53 50s",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := parseIPVSConn(strings.NewReader("TCP 0AF40263 0000 XYZ 0050 0AF40102 1F90 NONE 3599\n")); err == nil {
		t.Error("a line with a bad address is accepted")
	}
}
