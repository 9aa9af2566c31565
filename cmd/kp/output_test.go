package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// jsonLines decodes out as JSON Lines: one object a line, each with a type.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["type"] == nil {
			t.Fatalf("not a JSON object with a type: %q (%v)\nall of stdout:\n%s", line, err, out)
		}
		lines = append(lines, m)
	}
	return lines
}

func types(lines []map[string]any) []string {
	var out []string
	for _, l := range lines {
		out = append(out, l["type"].(string))
	}
	return out
}

func TestMigrateNodeJSONIsThePlanEachStepTheReportAndTheResult(t *testing.T) {
	for _, tc := range []struct {
		name      string
		socket    string
		wantTypes string
		code      int
		errorHas  string
	}{
		{"switched", fakeNodeKP(t, "", statusapi.MigrationSucceeded), "plan step report result", 0, ""},
		{"failed", fakeNodeKP(t, "", statusapi.MigrationFailed), "plan step step result", exitFailed, "step verify: verify iptables-nft: 1 address not carried"},
		{"refused", fakeNodeKP(t, "switch 3 to iptables-legacy (asked by kp migrate node) is running", ""), "plan result", exitRefused, "409 Conflict"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.a.inventory = nodeInventory()
			code := h.run("migrate", "node", "--to", "iptables-nft", "--status-socket", tc.socket, "-o", "json")
			lines := jsonLines(t, h.stdout.String())
			if code != tc.code || strings.Join(types(lines), " ") != tc.wantTypes {
				t.Fatalf("exit %d, types %q; want exit %d, %q\n%s", code, types(lines), tc.code, tc.wantTypes, h.stdout.String())
			}
			plan, result := lines[0], lines[len(lines)-1]
			if plan["node"] != "node-a" || plan["running"] != "nftables" || plan["target"] != "iptables-nft" || plan["add"] != true ||
				plan["servicePorts"] != 2.0 || len(plan["programs"].([]any)) != 1 || len(plan["remove"].([]any)) != 1 {
				t.Errorf("plan: %v", plan)
			}
			errText, _ := result["error"].(string)
			if result["exitCode"] != float64(tc.code) || !strings.Contains(errText, tc.errorHas) {
				t.Errorf("result: %v, want exitCode %d and an error holding %q", result, tc.code, tc.errorHas)
			}
			if tc.name == "switched" {
				step, report := lines[1], lines[2]
				if s, _ := step["step"].(map[string]any); s["name"] != "program" || step["node"] != "node-a" {
					t.Errorf("step: %v", step)
				}
				if p, _ := report["programs"].([]any); report["target"] != "iptables-nft" || len(p) != 1 || p[0].(map[string]any)["mode"] != "iptables-nft" {
					t.Errorf("report: %v", report)
				}
			}
		})
	}
	// --dry-run: the plan and the result only, nothing asked of kp.
	h := newHarness(t)
	h.a.inventory = nodeInventory()
	code := h.run("migrate", "node", "--to", "iptables-nft", "--dry-run", "--status-socket", fakeNodeKP(t, "must not be asked", ""), "-o", "json")
	if lines := jsonLines(t, h.stdout.String()); code != 0 || strings.Join(types(lines), " ") != "plan result" || lines[0]["dryRun"] != true {
		t.Errorf("--dry-run: exit %d\n%s", code, h.stdout.String())
	}
}

func TestMigrateClusterJSONIsThePlanThenTheResult(t *testing.T) {
	h := newHarness(t)
	kubeadmFake(t, h)
	code := h.run("migrate", "cluster", "--to", "iptables", "--dry-run", "-o", "json")
	lines := jsonLines(t, h.stdout.String())
	if code != 0 || strings.Join(types(lines), " ") != "plan message result" {
		t.Fatalf("exit %d, types %q\n%s", code, types(lines), h.stdout.String())
	}
	plan := lines[0]["plan"].(map[string]any)
	nodes := plan["nodes"].([]any)
	if plan["kind"] != "to" || plan["to"] != "iptables" || len(nodes) != 2 || nodes[0].(map[string]any)["node"] != "node-1" {
		t.Errorf("plan: %v", plan)
	}
	if lines[1]["message"] != "Dry run: nothing changed." || lines[2]["exitCode"] != 0.0 {
		t.Errorf("message, result: %v %v", lines[1], lines[2])
	}
	// A failure before the plan still ends with the result.
	h = newHarness(t)
	code = h.run("migrate", "cluster", "--to", "iptables", "-o", "json", "--kubeconfig", "/nonexistent")
	if lines := jsonLines(t, h.stdout.String()); code != exitFailed || len(lines) != 1 || lines[0]["exitCode"] != 1.0 ||
		!strings.Contains(lines[0]["error"].(string), "API client") {
		t.Errorf("exit %d\n%s", code, h.stdout.String())
	}
}

func TestStatusJSONIsTheStatusAPIsBody(t *testing.T) {
	// kp status -o json: TestStatusReadsTheSocket; here, that it is one
	// JSON document and nothing else.
	h := newHarness(t)
	code := h.run("status", "--status-socket", fakeNodeKP(t, "", ""), "-o", "json")
	var st statusapi.Status
	if err := json.Unmarshal(h.stdout.Bytes(), &st); code != 0 || err != nil || st.Mode != "nftables" || st.Node != "node-a" {
		t.Errorf("exit %d, %v: %s", code, err, h.stdout.String())
	}
}
