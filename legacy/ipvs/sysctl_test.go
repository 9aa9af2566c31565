package ipvs

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/internal/sysctl"
	"github.com/kpproxy/kp/proxy"
)

// The sysctls the backend sets at its setup are its Sysctls, the list kp
// sysctl (the init container) sets and kp proxy checks: one list.
func TestSetupSetsExactlyTheSysctlsItLists(t *testing.T) {
	for _, strict := range []bool{false, true} {
		r := newIPVSRenderer(t).(ipvsRenderer)
		r.b.cfg.IPVS.StrictARP = strict
		var set []string
		r.b.sysctl = func(name, value string) error { set = append(set, name+"="+value); return nil }
		if err := r.b.Sync(context.Background(), &proxy.State{}); err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, s := range r.b.Sysctls() {
			listed = append(listed, s.Name+"="+s.Value)
		}
		want := []string{"net.ipv4.vs.conntrack=1", "net.ipv4.vs.expire_nodest_conn=1", "net.ipv4.vs.expire_quiescent_template=1", "net.ipv4.ip_forward=1"}
		if strict {
			want = append(want, "net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2")
		}
		if !slices.Equal(set, listed) || !slices.Equal(listed, want) {
			t.Errorf("strictARP %v: set %v, listed %v, want %v", strict, set, listed, want)
		}
	}
}

func TestASysctlSetupCannotSetFailsNamingItAndTheFix(t *testing.T) {
	r := newIPVSRenderer(t).(ipvsRenderer)
	dir := sysctl.Dir(t.TempDir())
	// A sysctl that is a folder cannot be read or written.
	if err := os.MkdirAll(dir.Path("net.ipv4.vs.conntrack"), 0o755); err != nil {
		t.Fatal(err)
	}
	r.b.sysctl = writeSysctlIn(dir)
	err := r.b.Sync(context.Background(), &proxy.State{})
	if err == nil || !strings.Contains(err.Error(), "net.ipv4.vs.conntrack=1") || !strings.Contains(err.Error(), "run kp sysctl") {
		t.Errorf("Sync = %v; want the sysctl and the fix named", err)
	}
}
