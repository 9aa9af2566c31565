package conntrack

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Tuning is what upstream kube-proxy sets in the node's conntrack at start
// (its --conntrack-* flags and the conntrack: section of
// KubeProxyConfiguration), with the same meaning: a zero value leaves the
// kernel's value alone.
type Tuning struct {
	// MaxPerCore times the number of CPUs, but at least Min, is written to
	// nf_conntrack_max (and a quarter of it to the hash size, when the
	// hash is smaller). MaxPerCore 0 leaves both.
	MaxPerCore int32
	Min        int32

	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	// TCPBeLiberal true sets nf_conntrack_tcp_be_liberal=1 (false leaves it).
	TCPBeLiberal     bool
	UDPTimeout       time.Duration
	UDPStreamTimeout time.Duration
}

// DefaultTuning is upstream kube-proxy's default configuration.
func DefaultTuning() Tuning {
	return Tuning{
		MaxPerCore:            32 * 1024,
		Min:                   128 * 1024,
		TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout:   time.Hour,
	}
}

// Sysctl is one conntrack setting kp was asked to make and what came of it.
type Sysctl struct {
	// Name is the sysctl's dotted name (net.netfilter.nf_conntrack_max),
	// or the module parameter's path for the hash size.
	Name string
	Want string
	// Old is the value kp found, New the value in force afterwards (Old
	// again when the write failed).
	Old, New string
	Err      error
}

func (s Sysctl) Changed() bool { return s.Err == nil && s.Old != s.New }

// Tuner writes a Tuning into the calling process's network namespace.
// Its paths are fields so tests can point it at a folder.
type Tuner struct {
	ProcSys   string // default /proc/sys
	SysModule string // default /sys/module (nf_conntrack/parameters/hashsize)
	NumCPU    func() int
}

func (t Tuner) procSys() string {
	if t.ProcSys == "" {
		return "/proc/sys"
	}
	return t.ProcSys
}

func (t Tuner) hashsizePath() string {
	dir := t.SysModule
	if dir == "" {
		dir = "/sys/module"
	}
	return filepath.Join(dir, "nf_conntrack", "parameters", "hashsize")
}

func (t Tuner) numCPU() int {
	if t.NumCPU != nil {
		return t.NumCPU()
	}
	return runtime.NumCPU()
}

// Max is the nf_conntrack_max that tu asks for on this machine, 0 for none:
// upstream's MaxPerCore × CPUs, floored at Min.
func (t Tuner) Max(tu Tuning) int {
	if tu.MaxPerCore <= 0 {
		return 0
	}
	return max(int(tu.MaxPerCore)*t.numCPU(), int(tu.Min))
}

// Apply writes every non-zero setting of tu that differs from the kernel's,
// logging each change (old → new). A setting it cannot write (a read-only
// /proc/sys, as in a container without privileges; nf_conntrack_max, which
// only the initial network namespace may set) is logged as a warning that
// names the sysctl and how to allow it; Apply never fails. It returns what
// it did, for the status API.
func (t Tuner) Apply(tu Tuning, log *slog.Logger) []Sysctl {
	var out []Sysctl
	set := func(name string, value int) {
		out = append(out, t.write(name, strconv.Itoa(value)))
	}
	seconds := func(d time.Duration) int { return int(d / time.Second) }
	if m := t.Max(tu); m > 0 {
		set("nf_conntrack_max", m)
		if s, ok := t.hashsize(m / 4); ok {
			out = append(out, s)
		}
	}
	if tu.TCPEstablishedTimeout >= time.Second {
		set("nf_conntrack_tcp_timeout_established", seconds(tu.TCPEstablishedTimeout))
	}
	if tu.TCPCloseWaitTimeout >= time.Second {
		set("nf_conntrack_tcp_timeout_close_wait", seconds(tu.TCPCloseWaitTimeout))
	}
	if tu.TCPBeLiberal {
		set("nf_conntrack_tcp_be_liberal", 1)
	}
	if tu.UDPTimeout >= time.Second {
		set("nf_conntrack_udp_timeout", seconds(tu.UDPTimeout))
	}
	if tu.UDPStreamTimeout >= time.Second {
		set("nf_conntrack_udp_timeout_stream", seconds(tu.UDPStreamTimeout))
	}
	for _, s := range out {
		switch {
		case s.Err != nil:
			log.Warn("cannot set a conntrack sysctl; kp goes on with the kernel's value",
				"sysctl", s.Name, "want", s.Want, "value", s.Old, "error", s.Err.Error(), "fix", howToAllow(s))
		case s.Changed():
			log.Info("set conntrack sysctl", "sysctl", s.Name, "old", s.Old, "new", s.New)
		default:
			log.Debug("conntrack sysctl already set", "sysctl", s.Name, "value", s.New)
		}
	}
	return out
}

// write sets net.netfilter.NAME to want unless it already has that value.
func (t Tuner) write(name, want string) Sysctl {
	path := filepath.Join(t.procSys(), "net", "netfilter", name)
	s := Sysctl{Name: "net.netfilter." + name, Want: want}
	old, err := readTrimmed(path)
	if err != nil {
		s.Err = err
		return s
	}
	s.Old, s.New = old, old
	if old == want {
		return s
	}
	if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
		s.Err = err
		return s
	}
	// Read back: some writes succeed without effect.
	if s.New, err = readTrimmed(path); err == nil && s.New != want {
		s.Err = fmt.Errorf("the kernel kept %s", s.New)
	}
	return s
}

// hashsize grows the conntrack hash table to want buckets when it is
// smaller, as upstream does; it reports false when nothing needs doing.
// The kernel refuses the write outside the initial network namespace; in
// one it is needed only on a node whose hash is smaller than a quarter of
// the table's maximum.
func (t Tuner) hashsize(want int) (Sysctl, bool) {
	path := t.hashsizePath()
	s := Sysctl{Name: path, Want: strconv.Itoa(want)}
	old, err := readTrimmed(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, false // nf_conntrack is built in without parameters
	}
	if err != nil {
		s.Err = err
		return s, true
	}
	s.Old, s.New = old, old
	if n, err := strconv.Atoi(old); err == nil && n >= want {
		return s, false
	}
	if err := os.WriteFile(path, []byte(s.Want), 0o644); err != nil {
		s.Err = err
		return s, true
	}
	s.New, _ = readTrimmed(path)
	return s, true
}

func howToAllow(s Sysctl) string {
	if strings.HasPrefix(s.Name, "net.") {
		return "run kp (or its init container, `kp sysctl`) with a writable /proc/sys: privileged, as in manifests/daemonset.yaml; " +
			"or set it on the node; or set the matching --conntrack-* flag to 0 to leave it"
	}
	return "write it from the host (the conntrack hash size is global and only the initial network namespace may change it), " +
		"or set --conntrack-max-per-core=0 to leave the table's size"
}

func readTrimmed(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
