package options

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// newJSONHandler writes upstream's JSON log shape (component-base's zap
// encoder): "ts" in milliseconds since the epoch as a float, "caller" as
// dir/file.go:line, "msg", "v" (the verbosity; none on errors), then the
// key/value pairs. Only the order of the keys differs (slog writes "v"
// before "caller").
func newJSONHandler(w io.Writer, level slog.Level) slog.Handler {
	return slog.NewJSONHandler(w, &slog.HandlerOptions{
		AddSource:   true,
		Level:       level,
		ReplaceAttr: zapShape,
	})
}

func zapShape(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	// The built-in attributes only: a key/value pair named "source" or
	// "level" by kp's code is left as it is.
	switch v := a.Value.Any(); {
	case a.Key == slog.TimeKey && a.Value.Kind() == slog.KindTime:
		return slog.Float64("ts", float64(a.Value.Time().UnixNano())/1e6)
	case a.Key == slog.LevelKey:
		l, ok := v.(slog.Level)
		if !ok {
			return a
		}
		switch {
		case l >= slog.LevelError:
			return slog.Attr{} // upstream's errors carry no verbosity
		case l < slog.LevelInfo:
			return slog.Int("v", int(-l))
		}
		return slog.Int("v", 0) // upstream has no warning level: info at 0
	case a.Key == slog.SourceKey:
		src, ok := v.(*slog.Source)
		if !ok {
			return a
		}
		return slog.String("caller", shortCaller(src.File, src.Line))
	}
	return a
}

// shortCaller is zap's short caller: the file's folder and name, and the line.
func shortCaller(file string, line int) string {
	dir, name := filepath.Split(file)
	if dir != "" {
		name = filepath.Base(dir) + "/" + name
	}
	return name + ":" + strconv.Itoa(line)
}

// splitHandler writes errors to one handler and everything else to the
// other (upstream's --log-*-split-stream: errors to stderr, info to stdout).
type splitHandler struct {
	info, errors slog.Handler
}

func (h splitHandler) pick(l slog.Level) slog.Handler {
	if l >= slog.LevelError {
		return h.errors
	}
	return h.info
}

func (h splitHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.pick(l).Enabled(ctx, l)
}

func (h splitHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.pick(r.Level).Handle(ctx, r)
}

func (h splitHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return splitHandler{info: h.info.WithAttrs(attrs), errors: h.errors.WithAttrs(attrs)}
}

func (h splitHandler) WithGroup(name string) slog.Handler {
	return splitHandler{info: h.info.WithGroup(name), errors: h.errors.WithGroup(name)}
}

// quantity is a flag holding a Kubernetes quantity (512, 1K, 2Ki), as
// upstream's --log-*-info-buffer-size; kept as text so LogOptions stays
// comparable.
type quantity string

func (q *quantity) String() string { return string(*q) }

func (q *quantity) Set(s string) error {
	if _, err := resource.ParseQuantity(s); err != nil {
		return err
	}
	*q = quantity(s)
	return nil
}

func (q *quantity) Type() string { return "quantity" }

func (q quantity) zero() bool {
	if q == "" {
		return true
	}
	v, err := resource.ParseQuantity(string(q))
	return err == nil && v.IsZero()
}

// parseVModule checks upstream's --vmodule syntax: pattern=N pairs,
// comma-separated.
func parseVModule(s string) (map[string]int, error) {
	out := map[string]int{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		pattern, n, ok := strings.Cut(item, "=")
		if !ok || pattern == "" {
			return nil, fmt.Errorf("%q: want pattern=N", item)
		}
		v, err := strconv.ParseUint(n, 10, 31)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", item, errors.Unwrap(err))
		}
		out[pattern] = int(v)
	}
	return out, nil
}
