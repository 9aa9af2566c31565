package nft

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// notice is one nf_tables notification from port, of msgType, for table
// of family fam, naming obj in attribute nameAttr.
func notice(t *testing.T, port uint32, msgType int, fam byte, table string, nameAttr uint16, obj string) netlink.Message {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.String(1, table)
	if nameAttr != 0 {
		ae.String(nameAttr, obj)
	}
	data, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType), PID: port},
		Data: append([]byte{fam, 0, 0, 0}, data...)}
}

func newGen(t *testing.T, port uint32, pid uint32, comm string) netlink.Message {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Uint32(unix.NFTA_GEN_ID, 7)
	ae.Uint32(unix.NFTA_GEN_PROC_PID, pid)
	ae.String(unix.NFTA_GEN_PROC_NAME, comm)
	data, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN), PID: port},
		Data: append([]byte{unix.AF_UNSPEC, 0, 0, 0}, data...)}
}

func TestForeignTransactionsOnKPsTablesAreDriftAndNothingElse(t *testing.T) {
	const kp, nftCLI = 100, 4242
	ip, ip6 := byte(familyIPv4.nf), byte(familyIPv6.nf)
	tests := []struct {
		name string
		msgs []netlink.Message
		want string // "" for no drift
		by   string
	}{
		{name: "kp's own transaction", msgs: []netlink.Message{
			notice(t, kp, unix.NFT_MSG_DELSETELEM, ip, "kp", unix.NFTA_SET_ELEM_LIST_SET, "service-ips"),
			newGen(t, kp, 1, "kp")}},
		{name: "another table", msgs: []netlink.Message{
			notice(t, nftCLI, unix.NFT_MSG_DELSETELEM, ip, "kube-proxy", unix.NFTA_SET_ELEM_LIST_SET, "service-ips"),
			newGen(t, nftCLI, nftCLI, "nft")}},
		{name: "kp's table in another family", msgs: []netlink.Message{
			notice(t, nftCLI, unix.NFT_MSG_DELTABLE, byte(unix.NFPROTO_INET), "kp", 0, ""),
			newGen(t, nftCLI, nftCLI, "nft")}},
		{name: "a deleted element", msgs: []netlink.Message{
			notice(t, nftCLI, unix.NFT_MSG_DELSETELEM, ip, "kp", unix.NFTA_SET_ELEM_LIST_SET, "service-ips"),
			newGen(t, nftCLI, nftCLI, "nft")},
			want: "ip kp: deleted 1 element of set service-ips", by: "nft (pid 4242)"},
		{name: "a flushed chain, both families", msgs: []netlink.Message{
			notice(t, nftCLI, unix.NFT_MSG_DELRULE, ip, "kp", unix.NFTA_RULE_CHAIN, "services"),
			notice(t, nftCLI, unix.NFT_MSG_DELRULE, ip, "kp", unix.NFTA_RULE_CHAIN, "services"),
			notice(t, nftCLI, unix.NFT_MSG_DELRULE, ip6, "kp", unix.NFTA_RULE_CHAIN, "services"),
			newGen(t, nftCLI, 99, "iptables-nft-re")},
			want: "ip kp, ip6 kp: deleted 3 rules of chain services", by: "iptables-nft-re (pid 99)"},
		{name: "a deleted table and an added chain", msgs: []netlink.Message{
			notice(t, nftCLI, unix.NFT_MSG_NEWCHAIN, ip, "kp", unix.NFTA_CHAIN_NAME, "mine"),
			notice(t, nftCLI, unix.NFT_MSG_DELTABLE, ip6, "kp", 0, ""),
			newGen(t, nftCLI, nftCLI, "nft")},
			want: "ip kp, ip6 kp: added 1 chain mine; deleted 1 table", by: "nft (pid 4242)"},
		{name: "the kernel's own (port 0)", msgs: []netlink.Message{
			notice(t, 0, unix.NFT_MSG_DELSETELEM, ip, "kp", unix.NFTA_SET_ELEM_LIST_SET, "affinity"),
			newGen(t, 0, 0, "")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tx := &foreignTx{own: func(p uint32) bool { return p == kp }}
			var got []string
			var by string
			for _, m := range tc.msgs {
				if d := tx.note(m); d != nil {
					got = append(got, d.What)
					by = d.By
				}
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("drift %q, want none", got)
			case tc.want != "" && (len(got) != 1 || got[0] != tc.want || by != tc.by):
				t.Errorf("drift %q by %q, want %q by %q", got, by, tc.want, tc.by)
			}
		})
	}
}

// TestLostAreOwn: an overflow hid nothing but kp's own transactions when
// every generation after the last one heard, up to the current one, is
// kp's; an unknown start, a counter gone backwards or a span past what kp
// keeps is not judged so.
func TestLostAreOwn(t *testing.T) {
	own := func(gs ...uint32) func(uint32) bool {
		return func(g uint32) bool { return slices.Contains(gs, g) }
	}
	for _, c := range []struct {
		last, cur uint32
		own       func(uint32) bool
		want      bool
	}{
		{10, 10, own(), true},
		{10, 12, own(11, 12), true},
		{10, 12, own(12), false},
		{10, 12, own(11), false},
		{0, 12, own(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), false},
		{12, 10, own(11, 12), false},
		{1, 1 + maxOwnGens + 1, func(uint32) bool { return true }, false},
	} {
		if got := lostAreOwn(c.last, c.cur, c.own); got != c.want {
			t.Errorf("lostAreOwn(%d, %d) = %t, want %t", c.last, c.cur, got, c.want)
		}
	}
}
