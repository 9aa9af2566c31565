package boot

import (
	"reflect"
	"testing"
)

func TestOrderLoadsDependenciesFirstOnceAndSkipsBuiltins(t *testing.T) {
	ix := Index{
		"ip_vs":          {Path: "kernel/net/netfilter/ipvs/ip_vs.ko", Depends: []string{"nf_conntrack", "libcrc32c"}, Aliases: []string{"net-pf-16-proto-16-family-IPVS"}},
		"ip_vs_rr":       {Path: "kernel/net/netfilter/ipvs/ip_vs_rr.ko", Depends: []string{"ip_vs"}},
		"nf_conntrack":   {Path: "kernel/net/netfilter/nf_conntrack.ko", Depends: []string{"libcrc32c", "nf_defrag_ipv4"}},
		"nf_defrag_ipv4": {Path: "kernel/net/ipv4/netfilter/nf_defrag_ipv4.ko"},
		"libcrc32c":      {Path: "kernel/lib/libcrc32c.ko"},
		"dummy":          {Path: "kernel/drivers/net/dummy.ko", Aliases: []string{"rtnl-link-dummy"}},
		"nft_chain_nat":  {Path: "kernel/net/netfilter/nft_chain_nat.ko", Aliases: []string{"nft-chain-2-nat", "nft-chain-10-nat"}},
		"unix":           {}, // built in
	}
	for _, tc := range []struct {
		name    string
		ask     []string
		want    []string
		wantErr bool
	}{
		{name: "dependencies before the module", ask: []string{"ip_vs_rr"},
			want: []string{"libcrc32c", "nf_defrag_ipv4", "nf_conntrack", "ip_vs", "ip_vs_rr"}},
		{name: "each module once", ask: []string{"nf_conntrack", "ip_vs", "ip_vs_rr"},
			want: []string{"libcrc32c", "nf_defrag_ipv4", "nf_conntrack", "ip_vs", "ip_vs_rr"}},
		{name: "dashes are underscores", ask: []string{"ip-vs-rr"},
			want: []string{"libcrc32c", "nf_defrag_ipv4", "nf_conntrack", "ip_vs", "ip_vs_rr"}},
		{name: "an alias the kernel requests", ask: []string{"rtnl-link-dummy"}, want: []string{"dummy"}},
		{name: "a glob-free alias with digits", ask: []string{"nft-chain-2-nat"}, want: []string{"nft_chain_nat"}},
		{name: "generic netlink family alias", ask: []string{"net-pf-16-proto-16-family-IPVS"},
			want: []string{"libcrc32c", "nf_defrag_ipv4", "nf_conntrack", "ip_vs"}},
		{name: "built-in modules load nothing", ask: []string{"unix"}, want: nil},
		{name: "an unknown module is an error", ask: []string{"ip_vs_nope"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ix.Order(tc.ask...)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Order(%v) error = %v, want error %v", tc.ask, err, tc.wantErr)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Order(%v) = %v, want %v", tc.ask, got, tc.want)
			}
		})
	}
}

func TestOrderErrorNamesTheMissingDependency(t *testing.T) {
	ix := Index{"ip_vs_rr": {Path: "ip_vs_rr.ko", Depends: []string{"ip_vs"}}}
	_, err := ix.Order("ip_vs_rr")
	if err == nil || err.Error() != "module ip_vs (needed by ip_vs_rr): not in this kernel" {
		t.Errorf("error = %v, want it to name ip_vs and ip_vs_rr", err)
	}
}
