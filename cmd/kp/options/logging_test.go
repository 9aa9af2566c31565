package options

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

func TestVerbosityMapsOntoSlogLevels(t *testing.T) {
	tests := []struct {
		v    int
		want slog.Level
	}{
		{0, slog.LevelInfo},
		{1, slog.Level(-1)},
		{2, slog.Level(-2)},
		{4, slog.LevelDebug},
		{6, slog.Level(-6)},
	}
	for _, tt := range tests {
		if got := (LogOptions{format: "text", verbosity: tt.v}).logLevel(); got != tt.want {
			t.Errorf("-v %d: level %v, want %v", tt.v, got, tt.want)
		}
	}
}

func TestKlogIsRoutedIntoSlogAtItsVerbosity(t *testing.T) {
	var buf bytes.Buffer
	if _, err := NewLogger(io.Discard, &buf, LogOptions{format: "json", verbosity: 2, flushFrequency: time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = NewLogger(io.Discard, &bytes.Buffer{}, DefaultLogOptions()) })

	klog.InfoS("from client-go", "k", "v")
	klog.V(2).InfoS("at v2")
	klog.V(3).InfoS("at v3")
	klog.ErrorS(nil, "an error")

	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON log line: %q", line)
		}
		msgs = append(msgs, rec["msg"].(string))
	}
	if got, want := strings.Join(msgs, "|"), "from client-go|at v2|an error"; got != want {
		t.Errorf("klog messages through slog: %q, want %q\n%s", got, want, buf.String())
	}
}

// kube-proxy's users parse its logs: the default text is klog's, byte for
// byte as upstream's component-base writes it: severity letter, MMDD, time
// with microseconds, the process ID right-aligned in 7 columns, file:line,
// "] ", the quoted message, then key="value" pairs (strings quoted, numbers
// bare, errors as err="...").
func TestTextLogsAreKlogsFormat(t *testing.T) {
	var stdout, stderr bytes.Buffer
	log, err := NewLogger(&stdout, &stderr, DefaultLogOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = NewLogger(io.Discard, io.Discard, DefaultLogOptions()) })
	_, _, line, _ := runtime.Caller(0)
	log.Info("starting kp proxy", "mode", "nftables", "refused", 0)
	log.Warn("a warning", "sysctl", "net.netfilter.nf_conntrack_max")
	log.Error("sync failed", "err", errors.New("boom"))
	log.Debug("not at -v 0")
	klog.InfoS("from client-go", "k", "v")

	pid := fmt.Sprintf(" %7d ", os.Getpid())
	wants := []string{
		fmt.Sprintf(`I\d{4} \d\d:\d\d:\d\d\.\d{6}%slogging_test\.go:%d\] "starting kp proxy" mode="nftables" refused=0`, pid, line+1),
		fmt.Sprintf(`W\d{4} \d\d:\d\d:\d\d\.\d{6}%slogging_test\.go:%d\] "a warning" sysctl="net.netfilter.nf_conntrack_max"`, pid, line+2),
		fmt.Sprintf(`E\d{4} \d\d:\d\d:\d\d\.\d{6}%slogging_test\.go:%d\] "sync failed" err="boom"`, pid, line+3),
		fmt.Sprintf(`I\d{4} \d\d:\d\d:\d\d\.\d{6}%slogging_test\.go:%d\] "from client-go" k="v"`, pid, line+5),
	}
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	if len(lines) != len(wants) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(wants), stderr.String())
	}
	for i, want := range wants {
		if !regexp.MustCompile("^" + want + "$").MatchString(lines[i]) {
			t.Errorf("line %d:\n%s\nwant the shape\n%s", i+1, lines[i], want)
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("a single stream writes nothing to stdout: %q", stdout.String())
	}
}

// The json format is upstream's zap shape: ts in milliseconds, caller as
// folder/file:line, msg, v (none on errors), the pairs.
func TestJSONLogsAreUpstreamsShape(t *testing.T) {
	var stderr bytes.Buffer
	o := DefaultLogOptions()
	o.format, o.verbosity = "json", 4
	log, err := NewLogger(io.Discard, &stderr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = NewLogger(io.Discard, io.Discard, DefaultLogOptions()) })
	before := float64(time.Now().UnixMilli())
	log.Info("starting", "mode", "nftables", "source", "manifests x")
	log.Debug("detail")
	log.Error("failed", "err", errors.New("boom"))
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("not JSON: %q", l)
		}
		recs = append(recs, rec)
	}
	if len(recs) != 3 {
		t.Fatalf("%d records:\n%s", len(recs), stderr.String())
	}
	for i, want := range []map[string]any{
		{"msg": "starting", "v": 0.0, "mode": "nftables", "source": "manifests x"},
		{"msg": "detail", "v": 4.0},
		{"msg": "failed", "err": "boom"},
	} {
		rec := recs[i]
		ts, _ := rec["ts"].(float64)
		caller, _ := rec["caller"].(string)
		if ts < before || ts > before+60_000 || !regexp.MustCompile(`^options/logging_test\.go:\d+$`).MatchString(caller) {
			t.Errorf("record %d: ts %v, caller %q", i, rec["ts"], rec["caller"])
		}
		delete(rec, "ts")
		delete(rec, "caller")
		if !reflect.DeepEqual(rec, want) {
			t.Errorf("record %d: %v, want %v", i, rec, want)
		}
	}
}

func TestSplitStreamSendsErrorsToStderrAndTheRestToStdout(t *testing.T) {
	var stdout, stderr bytes.Buffer
	o := DefaultLogOptions()
	o.textSplit = true
	log, err := NewLogger(&stdout, &stderr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = NewLogger(io.Discard, io.Discard, DefaultLogOptions()) })
	log.Info("info")
	log.Warn("warn")
	log.Error("error")
	if out, errs := stdout.String(), stderr.String(); strings.Count(out, "\n") != 2 || !strings.Contains(out, `"warn"`) ||
		strings.Count(errs, "\n") != 1 || !strings.Contains(errs, `"error"`) {
		t.Errorf("stdout:\n%s\nstderr:\n%s", out, errs)
	}
}
