// Package sysctl reads and sets kernel sysctls of the calling thread's
// network namespace through /proc/sys, or through a folder standing in
// for it in tests. Names are dotted, as sysctl(8) and the logs spell them:
// net.ipv4.vs.conntrack.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Dir is the root sysctls are read and written under; "" is /proc/sys.
type Dir string

// Path is the file of sysctl name (net.ipv4.vs.conntrack →
// /proc/sys/net/ipv4/vs/conntrack).
func (d Dir) Path(name string) string {
	root := string(d)
	if root == "" {
		root = "/proc/sys"
	}
	return filepath.Join(root, filepath.FromSlash(strings.ReplaceAll(name, ".", "/")))
}

// Get is the sysctl's value, without the trailing newline.
func (d Dir) Get(name string) (string, error) {
	b, err := os.ReadFile(d.Path(name))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Ensure sets the sysctl to value unless it has it already, and returns
// the value it found. A write the kernel takes without effect is an error
// naming the value it kept.
func (d Dir) Ensure(name, value string) (old string, err error) {
	old, err = d.Get(name)
	if err != nil {
		return "", err
	}
	if old == value {
		return old, nil
	}
	if err := os.WriteFile(d.Path(name), []byte(value+"\n"), 0o644); err != nil {
		return old, err
	}
	if now, err := d.Get(name); err == nil && now != value {
		return old, fmt.Errorf("the kernel kept %s=%s", name, now)
	}
	return old, nil
}
