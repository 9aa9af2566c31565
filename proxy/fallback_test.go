package proxy

import (
	"context"
	"errors"
	"strings"
	"testing"
)

type probed struct {
	NoneBackend
	mode Mode
	err  error
}

func (p probed) Mode() Mode                  { return p.mode }
func (p probed) Probe(context.Context) error { return p.err }

func TestFirstThatRunsStartsTheFirstModeWhoseProbePasses(t *testing.T) {
	noKernel := errors.New("no nf_tables")
	build := func(m Mode) (Backend, error) {
		switch m {
		case ModeNFTables:
			return probed{mode: m, err: noKernel}, nil
		case ModeIPTables:
			return nil, errors.New("no iptables binary")
		}
		return probed{mode: m}, nil
	}
	b, refused, err := FirstThatRuns(context.Background(), []Mode{ModeNFTables, ModeIPTables, ModeIPVS, ModeUserspace}, build)
	if err != nil || b.Mode() != ModeIPVS {
		t.Fatalf("chose %v, %v; want ipvs", b, err)
	}
	if len(refused) != 2 || refused[0].Mode != ModeNFTables || !errors.Is(refused[0].Reason, noKernel) ||
		refused[1].Mode != ModeIPTables || !strings.Contains(refused[1].Reason.Error(), "no iptables binary") {
		t.Errorf("refused %+v: want nftables (its probe) then iptables (its build)", refused)
	}
	if !strings.Contains(refused[0].Reason.Error(), "nftables mode cannot run on this node") {
		t.Errorf("a failed probe names its mode: %v", refused[0].Reason)
	}

	_, refused, err = FirstThatRuns(context.Background(), []Mode{ModeNFTables, ModeIPTables}, build)
	if err == nil || len(refused) != 2 || !strings.Contains(err.Error(), "no proxy mode can run on this node") ||
		!strings.Contains(err.Error(), "no iptables binary") {
		t.Errorf("none runs: %v, refused %+v: want an error joining every reason", err, refused)
	}
}
