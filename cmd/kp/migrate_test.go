package main

import (
	"strings"
	"testing"
)

func TestMigrateNodeErrorsNameTheNodeAndTheStep(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "node", "--to", "nftables", "--status-address", "127.0.0.1:1"},
			"kp: migrate node test-host: step plan: status API: "},
		{[]string{"migrate", "node", "--to", "ipvs-ish"}, `kp: --to: unknown mode "ipvs-ish"`},
		{[]string{"migrate", "node"}, `required flag(s) "to" not set`},
	} {
		h := newHarness(t)
		h.a.hostname = func() (string, error) { return "test-host", nil }
		if code := h.run(tc.args...); code != 1 || !strings.Contains(h.stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, h.stderr.String(), tc.want)
		}
	}
}

func TestMigrateHelpShowsExamples(t *testing.T) {
	for _, args := range [][]string{{"migrate", "--help"}, {"migrate", "node", "--help"}} {
		h := newHarness(t)
		if code := h.run(args...); code != 0 || !strings.Contains(h.stdout.String(), "kp migrate node --to") {
			t.Errorf("%v: exit %d, output:\n%s", args, code, h.stdout.String())
		}
	}
}
