package main

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// fakeNodeKP serves what kp migrate node reads of a node's kp: its status
// (nftables, on node-a) and its answers to a switch request: 409 with
// refuse, else a switch that ends in phase.
func fakeNodeKP(t *testing.T, refuse, phase string) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+statusapi.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(statusapi.Status{APIVersion: "kp/v1", Mode: "nftables", Node: "node-a", Healthy: true, ServicePorts: 2, Endpoints: 4})
	})
	now := time.Now()
	mig := statusapi.Migration{ID: 1, From: "nftables", To: "iptables-nft", Phase: phase, Started: now, Ended: now,
		Steps: []statusapi.MigrationStep{{Name: "program", Detail: "2 service ports", Started: now, Ended: now}}}
	if phase == statusapi.MigrationFailed {
		mig.Steps = append(mig.Steps, statusapi.MigrationStep{Name: "verify", Error: "1 address not carried", Started: now, Ended: now})
		mig.Error = "verify iptables-nft: 1 address not carried"
	}
	mux.HandleFunc("POST "+statusapi.MigrationPath, func(w http.ResponseWriter, _ *http.Request) {
		if refuse != "" {
			http.Error(w, refuse, http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(statusapi.Migration{ID: 1, From: "nftables", To: "iptables-nft", Phase: statusapi.MigrationPending})
	})
	mux.HandleFunc("GET "+statusapi.MigrationPath, func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(mig)
	})
	return serveSocket(t, mux)
}

// nodeInventory stands for the node's kernel: kp's nftables table alone,
// then, from the second look (after the switch), kp's iptables-nft chains.
func nodeInventory() func(*nodeSource, context.Context) ([]migrate.Found, error) {
	looks := 0
	return func(*nodeSource, context.Context) ([]migrate.Found, error) {
		looks++
		if looks > 1 {
			return []migrate.Found{{Owner: "kp", Mode: "iptables-nft", Where: "iptables-nft IPv4", Chains: 12, Rules: 30}}, nil
		}
		return []migrate.Found{{Owner: "kp", Mode: "nftables", Where: "nftables ip kp", Chains: 5, Rules: 9}}, nil
	}
}

func TestExitCodeSaysWhetherTheCommandFailedWasGivenWronglyOrWasRefused(t *testing.T) {
	refused := fakeNodeKP(t, "switch 3 to iptables-legacy (asked by kp migrate node) is running", "")
	failed := fakeNodeKP(t, "", statusapi.MigrationFailed)
	switched := fakeNodeKP(t, "", statusapi.MigrationSucceeded)
	noKP := filepath.Join(t.TempDir(), "kp.sock")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"done", []string{"version"}, 0, ""},
		{"done: a switch", []string{"migrate", "node", "--to", "iptables-nft", "--status-socket", switched}, 0, ""},
		{"failed: no kp proxy to ask", []string{"status", "--status-socket", noKP}, exitFailed, "is kp proxy running"},
		{"failed: the switch failed", []string{"migrate", "node", "--to", "iptables-nft", "--status-socket", failed}, exitFailed,
			"kp: migrate node node-a: step verify: verify iptables-nft: 1 address not carried"},
		{"bad usage: an unknown command", []string{"no-such-command"}, exitUsage, `unknown command "no-such-command" for "kp"`},
		{"bad usage: an unknown flag", []string{"status", "--no-such-flag"}, exitUsage, "unknown flag: --no-such-flag"},
		{"bad usage: a malformed flag value", []string{"migrate", "node", "--to", "nftables", "--timeout", "soon"}, exitUsage, `invalid argument "soon"`},
		{"bad usage: extra arguments", []string{"status", "extra"}, exitUsage, `unknown command "extra" for "kp status"`},
		{"bad usage: a required flag missing", []string{"migrate", "node"}, exitUsage, `required flag(s) "to" not set`},
		{"bad usage: a value the command refuses", []string{"status", "-o", "yaml"}, exitUsage, `--output "yaml": want text or json`},
		{"bad usage: flags that do not go together", []string{"migrate", "cluster", "--to", "iptables", "--print-config"}, exitUsage, "it goes with --from-kube-proxy"},
		{"refused: kp refuses the switch (409)", []string{"migrate", "node", "--to", "iptables-legacy", "--status-socket", refused}, exitRefused,
			"409 Conflict: switch 3 to iptables-legacy (asked by kp migrate node) is running"},
		// The preflight's refusal: TestMigrateClusterDryRunFailsOnAPreflightError.
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.a.inventory = nodeInventory()
			code := h.run(tc.args...)
			if code != tc.code || !strings.Contains(h.stderr.String(), tc.stderr) {
				t.Errorf("kp %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, h.stderr.String(), tc.code, tc.stderr)
			}
		})
	}
}

func TestEveryCommandsHelpDocumentsTheExitCodes(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"status", "--help"}, {"migrate", "node", "--help"}, {"migrate", "cluster", "--help"}, {"completion", "bash", "--help"}} {
		h := newHarness(t)
		if code := h.run(args...); code != 0 {
			t.Fatalf("kp %s: exit %d: %s", strings.Join(args, " "), code, h.stderr.String())
		}
		out := h.stdout.String()
		for _, want := range []string{"Exit status:", "\n  1  failed:", "\n  2  bad usage:", "\n  3  refused:"} {
			if !strings.Contains(out, want) {
				t.Errorf("kp %s lacks %q:\n%s", strings.Join(args, " "), want, out)
			}
		}
	}
}

func TestCompletionWritesEachShellsScript(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "# bash completion V2 for kp",
		"zsh":  "#compdef kp",
		"fish": "# fish completion for kp",
	} {
		h := newHarness(t)
		if code := h.run("completion", shell); code != 0 || !strings.Contains(h.stdout.String(), want) {
			t.Errorf("kp completion %s: exit %d, stderr %q, stdout starts %.80q; want %q", shell, code, h.stderr.String(), h.stdout.String(), want)
		}
	}
	// The script asks kp itself (kp __complete ...): commands and flags
	// complete from the tree.
	h := newHarness(t)
	if code := h.run("__complete", "migrate", ""); code != 0 || !strings.Contains(h.stdout.String(), "node\t") || !strings.Contains(h.stdout.String(), "cluster\t") {
		t.Errorf("kp __complete migrate '': exit %d, stdout %q", code, h.stdout.String())
	}
}
