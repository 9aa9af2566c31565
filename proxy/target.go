package proxy

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// AnnotationProxyMode on a Node asks the kp running there to switch to a
// mode (a Target's spelling: nftables, iptables, iptables-nft,
// iptables-legacy, ipvs, userspace; none, which removes kp's rules and
// programs nothing, hands the node back to kube-proxy). It persists the choice: a restarted kp
// starts in that mode whatever its flags say.
const AnnotationProxyMode = "kpproxy.io/proxy-mode"

// Target is a mode to run, with the iptables flavor when the mode is
// iptables ("" lets kp detect it, as at start).
type Target struct {
	Mode            Mode
	IPTablesBackend string // "nft", "legacy" or ""
}

// ParseTarget reads a target: a mode name, or iptables-nft /
// iptables-legacy for the iptables mode with that flavor.
func ParseTarget(s string) (Target, error) {
	s = strings.TrimSpace(s)
	switch s {
	case string(ModeNFTables), string(ModeIPTables), string(ModeIPVS), string(ModeUserspace), string(ModeNone):
		return Target{Mode: Mode(s)}, nil
	case "iptables-nft":
		return Target{Mode: ModeIPTables, IPTablesBackend: "nft"}, nil
	case "iptables-legacy":
		return Target{Mode: ModeIPTables, IPTablesBackend: "legacy"}, nil
	}
	return Target{}, fmt.Errorf("unknown mode %s: want nftables, iptables, iptables-nft, iptables-legacy, ipvs, userspace or none", QuoteBounded(s))
}

// maxQuoted bounds how much of a value a message repeats.
const maxQuoted = 64

// QuoteBounded quotes s for an error message, cut to its first 64 bytes
// (on a rune boundary) and marked … when longer: a value from outside (a
// Node annotation holds up to 256 KiB) goes into logs and Events, which
// must stay readable.
func QuoteBounded(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	cut := maxQuoted
	for i := 1; i < utf8.UTFMax && !utf8.RuneStart(s[cut]); i++ {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}

// String is the target's spelling, ParseTarget's input.
func (t Target) String() string {
	if t.Mode == ModeIPTables && t.IPTablesBackend != "" {
		return "iptables-" + t.IPTablesBackend
	}
	return string(t.Mode)
}

// Satisfies reports whether a backend running as t fulfils want: the same
// mode, and the same iptables flavor when want names one.
func (t Target) Satisfies(want Target) bool {
	return t.Mode == want.Mode && (want.IPTablesBackend == "" || want.IPTablesBackend == t.IPTablesBackend)
}
