package ipvs

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestProcIPVSReadsEveryVirtualServerWithItsRealServers: /proc/net/ip_vs as
// the kernel prints it (IPv4 in hex, IPv6 in full, persistence with its
// timeout in jiffies here, a firewall-mark server skipped with its real
// servers).
func TestProcIPVSReadsEveryVirtualServerWithItsRealServers(t *testing.T) {
	const table = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0050 rr persistent 2700000 FFFFFFFF
  -> 0AF40102:1F90      Masq    1      2          0
  -> 0AF40103:1F90      Masq    0      1          3
FWM  00000001 rr
  -> 0AF40109:1F90      Masq    1      0          0
UDP  [fd00:0096:0000:0000:0000:0000:0000:000a]:0035 sh
  -> [fd00:0010:0244:0000:0000:0000:0000:0002]:14E9      Masq    1      0          0
`
	got, err := parseProcIPVS(strings.NewReader(table))
	if err != nil {
		t.Fatal(err)
	}
	web := vsKey{Proto: v1.ProtocolTCP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 80}
	dns := vsKey{Proto: v1.ProtocolUDP, Addr: netip.MustParseAddr("fd00:96::a"), Port: 53}
	if len(got) != 2 || got[web] == nil || got[dns] == nil {
		t.Fatalf("virtual servers %v, want %s and %s", got, web, dns)
	}
	w := got[web]
	if w.svc.SchedName != "rr" || w.svc.Flags&ipvsFlagPersistent == 0 || !sameTimeout(w.svc.Timeout, 10800) || !w.procTimeout {
		t.Errorf("%s: %+v", web, w.svc)
	}
	if len(w.dests) != 2 || destAddrPort(w.dests[0]) != netip.MustParseAddrPort("10.244.1.2:8080") ||
		w.dests[1].Weight != 0 || w.dests[1].InactiveConnections != 3 || w.dests[0].ActiveConnections != 2 {
		t.Errorf("%s's real servers: %+v %+v", web, w.dests[0], w.dests[1])
	}
	if d := got[dns]; d.svc.SchedName != "sh" || len(d.dests) != 1 || destAddrPort(d.dests[0]) != netip.MustParseAddrPort("[fd00:10:244::2]:5353") {
		t.Errorf("%s: %+v %v", dns, d.svc, d.dests)
	}
	if _, err := parseProcIPVS(strings.NewReader(table + "TCP  0A60000A\n")); err == nil {
		t.Error("a broken line was read without an error")
	}
}
