package main

import (
	"strings"
	"testing"
)

func TestMigrateNodeErrorsNameTheNodeAndTheStep(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"migrate", "node", "--to", "nftables", "--status-socket", "/nonexistent/kp.sock"},
			"kp: migrate node test-host: step plan: status API: ", exitFailed},
		{[]string{"migrate", "node", "--to", "ipvs-ish"}, `kp: --to: unknown mode "ipvs-ish"`, exitUsage},
		{[]string{"migrate", "node"}, `required flag(s) "to" not set`, exitUsage},
		{[]string{"migrate", "node", "--to", "none"}, "kp: --to none: the none mode removes kp's rules", exitUsage},
	} {
		h := newHarness(t)
		h.a.hostname = func() (string, error) { return "test-host", nil }
		if code := h.run(tc.args...); code != tc.code || !strings.Contains(h.stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want exit %d and %q", tc.args, code, h.stderr.String(), tc.code, tc.want)
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

func TestMigrateClusterRefusesBadRequestsBeforeCallingTheAPI(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"migrate", "cluster"}, "kp: --to MODE or --from-kube-proxy is required", exitUsage},
		{[]string{"migrate", "cluster", "--to", "ipvs-ish"}, `kp: --to: unknown mode "ipvs-ish"`, exitUsage},
		{[]string{"migrate", "cluster", "--to", "none"}, "kp: --to none: the none mode is the rollback's", exitUsage},
		{[]string{"migrate", "cluster", "--to", "iptables", "--max-unavailable", "0"}, "kp: --max-unavailable 0: at least 1", exitUsage},
		{[]string{"migrate", "cluster", "--to", "iptables", "--kubeconfig", "/nonexistent"}, "kp: API client (--kubeconfig, KUBECONFIG or ~/.kube/config)", exitFailed},
		{[]string{"migrate", "cluster", "--from-kube-proxy", "--keep-kube-proxy", "--delete-kube-proxy"}, "kp: --keep-kube-proxy and --delete-kube-proxy: choose one", exitUsage},
	} {
		h := newHarness(t)
		if code := h.run(tc.args...); code != tc.code || !strings.Contains(h.stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want exit %d and %q", tc.args, code, h.stderr.String(), tc.code, tc.want)
		}
	}
}

func TestMigrateClusterHelpShowsExamples(t *testing.T) {
	h := newHarness(t)
	if code := h.run("migrate", "cluster", "--help"); code != 0 ||
		!strings.Contains(h.stdout.String(), "kp migrate cluster --from-kube-proxy --delete-kube-proxy") ||
		!strings.Contains(h.stdout.String(), "--rollback") {
		t.Errorf("exit %d, output:\n%s", code, h.stdout.String())
	}
}

// --keep-kube-proxy, what old scripts pass to keep kube-proxy's DaemonSet,
// still parses (deprecated: keeping is now the default).
func TestMigrateClusterAcceptsTheDeprecatedKeepKubeProxy(t *testing.T) {
	h := newHarness(t)
	code := h.run("migrate", "cluster", "--from-kube-proxy", "--keep-kube-proxy", "--kubeconfig", "/nonexistent")
	all := h.stdout.String() + h.stderr.String()
	if code != 1 || !strings.Contains(all, "--keep-kube-proxy has been deprecated") || !strings.Contains(all, "kp: API client") {
		t.Errorf("exit %d, output:\n%s", code, all)
	}
}
