package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// SaveAllFunc returns iptables-save's output of every table of one flavor
// and family. Detect's input, injectable for tests.
type SaveAllFunc func(ctx context.Context, fl Flavor, f proxy.Family) ([]byte, error)

// SaveAll runs the iptables-save of flavor fl and family f for all tables.
// It passes no -t: iptables-legacy-save -t TABLE makes the kernel create
// that table when it does not exist yet, and Detect must only look.
//
// For iptables-legacy it first reads which tables the kernel holds
// (LegacyTables): with none there is nothing to read, and SaveAll returns
// nothing without running iptables-legacy-save, so a kp without NET_RAW
// reads a node that has no legacy iptables.
//
// Its error is a *MissingBinaryError when the binary is not installed, and
// a *ReadError when it ran and failed; Absent tells which of them mean
// "this flavor and family are not on this node".
func SaveAll(ctx context.Context, fl Flavor, f proxy.Family) ([]byte, error) {
	bin := saveBinary(fl, f)
	path, err := lookBinary(bin)
	if err != nil {
		return nil, err
	}
	var tables []string
	if fl == FlavorLegacy {
		var known bool
		if tables, known = LegacyTables(f); known && len(tables) == 0 {
			return nil, nil // what iptables-legacy-save prints when there is no table
		}
	}
	cmd := exec.CommandContext(ctx, path)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		re := newReadError(fl, f, bin, err, stderr.String())
		re.Tables = tables
		return nil, re
	}
	return stdout.Bytes(), nil
}

// ReadError is a flavor and family whose rules could not be read: its
// iptables-save is installed, but ran and failed. Unless NotInKernel, it
// says nothing about what the kernel holds, so a caller must never take
// it for "no rules there": kube-proxy's rules may be in that flavor.
type ReadError struct {
	Flavor Flavor
	Family proxy.Family
	Binary string
	Err    error  // the exit status, or why the binary did not run
	Stderr string // iptables-save's own message, on one line
	// NotInKernel: the kernel lacks this flavor or family (its module not
	// loaded or not built), so no rules of it can exist.
	NotInKernel bool
	// Denied: the kernel refused the process (a capability missing).
	Denied bool
	// Tables are the tables the kernel listed for an iptables-legacy
	// family (LegacyTables), when it could be read: what was refused.
	Tables []string
}

func newReadError(fl Flavor, f proxy.Family, bin string, err error, stderr string) *ReadError {
	e := &ReadError{Flavor: fl, Family: f, Binary: bin, Err: err, Stderr: cleanStderr(stderr)}
	low := strings.ToLower(e.Stderr)
	e.Denied = strings.Contains(low, "permission denied") || strings.Contains(low, "operation not permitted")
	// The ways iptables 1.8 says the kernel part is missing: libiptc's
	// "Table does not exist (do you need to insmod?)" (legacy), and
	// nfnetlink's socket or nf_tables' family refused (nft).
	for _, absent := range []string{"do you need to insmod", "protocol not supported", "address family not supported"} {
		e.NotInKernel = e.NotInKernel || strings.Contains(low, absent)
	}
	return e
}

func (e *ReadError) Error() string {
	s := fmt.Sprintf("cannot read the rules of iptables-%s (%s): %s: %v", e.Flavor, e.Family, e.Binary, e.Err)
	if e.Stderr != "" {
		s += ": " + e.Stderr
	}
	if e.Denied {
		s += " (" + e.fix() + ")"
	}
	return s
}

func (e *ReadError) Unwrap() error { return e.Err }

// fix is what a denied read needs, for the message.
func (e *ReadError) fix() string {
	if e.Flavor == FlavorLegacy {
		// Legacy iptables talks to the kernel through a raw IP socket.
		held := ""
		if len(e.Tables) > 0 {
			held = fmt.Sprintf("the kernel holds iptables-legacy tables here (%s in %s), and ",
				strings.Join(e.Tables, ", "), strings.Replace(legacyTablesFile(e.Family), "/thread-self", "", 1))
		}
		return held + "iptables-legacy needs CAP_NET_RAW besides CAP_NET_ADMIN to read them: add NET_RAW to the " +
			"container's capabilities, as manifests/daemonset.yaml does"
	}
	return "iptables-nft needs CAP_NET_ADMIN: add NET_ADMIN to the container's capabilities"
}

// Absent reports whether err, from SaveAll, means that the flavor and
// family are not on this node at all: the binary is not installed, or the
// kernel lacks the part. Any other error is a failure to read what may be
// there.
func Absent(err error) bool {
	var missing *MissingBinaryError
	var re *ReadError
	return errors.As(err, &missing) || errors.As(err, &re) && re.NotInKernel && !re.Denied
}
