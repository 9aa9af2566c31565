package options

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

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
	if _, err := NewLogger(&buf, LogOptions{format: "json", verbosity: 2}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = NewLogger(&bytes.Buffer{}, DefaultLogOptions()) })

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
