package ipvs

import (
	"context"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

func TestProbeWithoutIPVSNamesTheModuleAndHowToLoadIt(t *testing.T) {
	cfg := proxy.Config{Mode: proxy.ModeIPVS, MasqueradeBit: 14, IPTablesBackend: "nft", IPVS: proxy.IPVSConfig{Scheduler: "sh"}}
	b, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.haveIPVS = func(context.Context) bool { return false }
	err = b.Probe(context.Background())
	for _, want := range []string{"ip_vs module is not loaded", "modprobe ip_vs", "ip_vs_sh"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("probe error %v lacks %q", err, want)
		}
	}
}

func TestNewRefusesAnUnknownScheduler(t *testing.T) {
	_, err := New(proxy.Config{Mode: proxy.ModeIPVS, IPVS: proxy.IPVSConfig{Scheduler: "fastest"}}, nil)
	if err == nil || !strings.Contains(err.Error(), `--ipvs-scheduler "fastest": unknown IPVS scheduler; use one of rr, wrr`) {
		t.Errorf("error = %v", err)
	}
}
