package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// runKP runs kp with args from the test's own namespace; it returns
// standard output, standard error and the exit code.
func (e *env) runKP(args ...string) (string, string, int) {
	e.t.Helper()
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(kp, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return stdout.String(), stderr.String(), exit.ExitCode()
	case err != nil:
		e.t.Fatalf("kp %s: %v", strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), 0
}

// explainJSON runs kp explain -o json, live or (snapshot not empty) from
// the file.
func (e *env) explainJSON(snapshot, from, dst string) *explain.Explanation {
	e.t.Helper()
	args := []string{"explain", "-o", "json", "--status-socket", e.socket}
	if snapshot != "" {
		args = append(args, "--snapshot", snapshot)
	}
	if from != "" {
		args = append(args, "--from", from)
	}
	out, stderr, code := e.runKP(append(args, dst)...)
	if code != 0 {
		e.t.Fatalf("kp %s: exit %d\n%s", strings.Join(args, " "), code, stderr)
	}
	var x explain.Explanation
	if err := json.Unmarshal([]byte(out), &x); err != nil {
		e.t.Fatalf("kp explain -o json: %v\n%s", err, out)
	}
	return &x
}

func eligible(x *explain.Explanation) []string {
	var out []string
	for _, ep := range x.Endpoints {
		if ep.Eligible {
			out = append(out, ep.Address)
		}
	}
	return out
}

// kp explain's answers, live and from kp snapshot's file, match kp's model
// and what a real packet meets: DNAT to the endpoints it names (the answer
// comes from one of them, masqueraded as it says), reject for a Service
// without endpoints and for a port the ClusterIP lacks (the connection is
// refused), nothing for an address that is no Service's. The per-mode rule
// path and the trace check are issue 37's next step.
func TestExplainMatchesWhatAPacketMeets(t *testing.T) {
	m := modeNFTables
	skipUnselected(t, m)
	e := newEnv(t, m, 2) // parallel
	pods := e.w.Pods()
	svc := web(pods...)
	svc.Type = v1.ServiceTypeNodePort
	svc.Ports[0].NodePort = 30080
	empty := Service{Name: "empty", ClusterIPs: []string{"10.96.0.20"}, Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}}
	e.write("web.yaml", svc, empty)
	e.startKP()
	e.answers(e.w.Client(), "tcp", webTCP)
	client := e.w.ClientIP().String()
	nodePort := hostPort(e.w.NodeIP().String(), 30080)
	podAddrs := []string{hostPort(pods[0].IP.String(), 8080), hostPort(pods[1].IP.String(), 8080)}
	slices.Sort(podAddrs)

	snapFile := filepath.Join(t.TempDir(), "node.kpsnap.json")
	if _, stderr, code := e.runKP("snapshot", "-o", snapFile, "--status-socket", e.socket); code != 0 {
		t.Fatalf("kp snapshot: exit %d\n%s", code, stderr)
	}
	checkSnapshotFile(t, snapFile)

	cases := []struct {
		name, from, dst string
		verdict         explain.Verdict
		reject          string
		endpoints       []string
		masquerade      string
		packet          func(t *testing.T, x *explain.Explanation)
	}{
		{name: "ClusterIP from outside the cluster", from: client, dst: webTCP, verdict: explain.VerdictDNAT,
			endpoints: podAddrs, masquerade: "yes", packet: func(t *testing.T, x *explain.Explanation) {
				answeredByOneOf(t, e, webTCP, pods, x)
			}},
		{name: "NodePort", from: client, dst: nodePort, verdict: explain.VerdictDNAT, endpoints: podAddrs, masquerade: "yes",
			packet: func(t *testing.T, x *explain.Explanation) { answeredByOneOf(t, e, nodePort, pods, x) }},
		{name: "a Service without endpoints", from: client, dst: "10.96.0.20:80", verdict: explain.VerdictReject, reject: "TCP reset",
			packet: func(t *testing.T, _ *explain.Explanation) { refused(t, e, "10.96.0.20:80") }},
		{name: "a port the ClusterIP lacks", from: client, dst: "10.96.0.10:81", verdict: explain.VerdictReject, reject: "TCP reset",
			packet: func(t *testing.T, _ *explain.Explanation) { refused(t, e, "10.96.0.10:81") }},
		{name: "no Service", from: client, dst: "192.0.2.1:80", verdict: explain.VerdictNotKPs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			live := e.explainJSON("", tc.from, tc.dst)
			offline := e.explainJSON(snapFile, tc.from, tc.dst)
			for _, x := range []struct {
				from string
				x    *explain.Explanation
			}{{"live", live}, {"snapshot", offline}} {
				masq := ""
				if x.x.Masquerade != nil {
					masq = x.x.Masquerade.Decision
				}
				got := eligible(x.x)
				slices.Sort(got)
				if x.x.Verdict != tc.verdict || x.x.Reject != tc.reject || !slices.Equal(got, tc.endpoints) || masq != tc.masquerade {
					t.Errorf("%s: %s (%s) reject %q to %v masquerade %q; want %s reject %q to %v masquerade %q",
						x.from, x.x.Verdict, x.x.Why, x.x.Reject, got, masq, tc.verdict, tc.reject, tc.endpoints, tc.masquerade)
				}
				if len(x.x.RulePath.Steps) == 0 && x.x.RulePath.Absent == "" {
					t.Errorf("%s: the rule path is neither shown nor said absent", x.from)
				}
			}
			if tc.packet != nil {
				tc.packet(t, live)
			}
		})
	}
	// The connection e.answers made before the snapshot was taken is in it
	// (TIME_WAIT): explain shows the flow's entry.
	if x := e.explainJSON(snapFile, client, webTCP); len(x.Conntrack) == 0 {
		t.Errorf("explain from the snapshot shows no conntrack entry of %s from %s", webTCP, client)
	}
	badInput(t, e, snapFile)
}

// answeredByOneOf connects from the client and checks that the pod that
// answers is one of the endpoints x chose, and that it saw the client's
// own address unless x said masquerade.
func answeredByOneOf(t *testing.T, e *env, addr string, pods []*netns.Pod, x *explain.Explanation) {
	t.Helper()
	reply, err := netns.Dial(e.w.Client(), "tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", addr, err)
	}
	name, seen := netns.ParseReply(reply)
	i := slices.IndexFunc(pods, func(p *netns.Pod) bool { return p.Name == name })
	if i < 0 || !slices.Contains(eligible(x), hostPort(pods[i].IP.String(), 8080)) {
		t.Errorf("%s: answered by %q, not one of the endpoints explain chose (%v)", addr, name, eligible(x))
	}
	masqueraded := x.Masquerade != nil && x.Masquerade.Decision == "yes"
	if sawClient := strings.HasPrefix(seen, e.w.ClientIP().String()+":"); sawClient == masqueraded {
		t.Errorf("%s: the endpoint saw %s; explain said masquerade %t", addr, seen, masqueraded)
	}
}

func refused(t *testing.T, e *env, addr string) {
	t.Helper()
	if _, err := netns.Dial(e.w.Client(), "tcp", addr, 5*time.Second); !isRefused(err) {
		t.Errorf("%s: %v; explain said reject with a TCP reset", addr, err)
	}
}

func checkSnapshotFile(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("snapshot file mode %v, want 0600", fi.Mode().Perm())
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	snap, err := explain.ReadSnapshot(f)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Mode != "nftables" || snap.Build == nil || len(snap.Services.ServicePorts) != 3 || len(snap.Proxy.NodePortIPs) == 0 {
		t.Errorf("snapshot: mode %q, build %v, %d service ports, NodePort IPs %v", snap.Mode, snap.Build, len(snap.Services.ServicePorts),
			snap.Proxy.NodePortIPs)
	}
	if len(snap.Rules) == 0 || !strings.Contains(snap.Rules[0].Text, "table ip kp") {
		t.Errorf("snapshot rules %+v (error %q): want nft's listing of table ip kp", snap.Rules, snap.RulesError)
	}
	if snap.ConntrackError != "" {
		t.Errorf("snapshot conntrack: %s", snap.ConntrackError)
	}
	if snap.Format != statusapi.SnapshotFormat {
		t.Errorf("format %q", snap.Format)
	}
}

// badInput: a truncated snapshot and a destination that is no address get
// an error that says so and kp's exit codes (1 failed, 2 bad usage).
func badInput(t *testing.T, e *env, snapFile string) {
	data, err := os.ReadFile(snapFile)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "cut.json")
	if err := os.WriteFile(cut, data[:len(data)/3], 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"explain", "--snapshot", cut, webTCP}, 1, "truncated"},
		{[]string{"explain", "--snapshot", snapFile, "10.96.0.10"}, 2, "IP:PORT"},
		{[]string{"explain", "--snapshot", snapFile, "--from", "fd00::1", webTCP}, 2, "different IP families"},
	} {
		_, stderr, code := e.runKP(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.says) {
			t.Errorf("kp %s: exit %d, %q; want exit %d saying %q", strings.Join(tc.args, " "), code, stderr, tc.code, tc.says)
		}
	}
}
