package ipvs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// IPSet runs the ipset binary in the calling thread's network namespace.
// Fake implementations hold sets in memory.
type IPSet interface {
	// Restore feeds data to `ipset restore` (one batch; ipset stops at the
	// first failing line and names it).
	Restore(ctx context.Context, data []byte) error
	// List returns the sets that exist among names, with their entries.
	List(ctx context.Context) (map[string][]string, error)
}

type execIPSet struct{}

func (execIPSet) Restore(ctx context.Context, data []byte) error {
	cmd := exec.CommandContext(ctx, "ipset", "restore")
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if _, lookErr := exec.LookPath("ipset"); lookErr != nil {
			return fmt.Errorf("ipset restore: the ipset binary is missing (apt-get install ipset): %w", lookErr)
		}
		return fmt.Errorf("ipset restore: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// List reads `ipset save` and keeps kp's sets.
func (execIPSet) List(ctx context.Context) (map[string][]string, error) {
	cmd := exec.CommandContext(ctx, "ipset", "save")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("ipset save: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return parseSave(stdout.Bytes()), nil
}

// parseSave reads `ipset save` output into kp's sets and their entries.
func parseSave(data []byte) map[string][]string {
	own := map[string]bool{}
	for _, n := range allSetNames() {
		own[n] = true
	}
	out := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !own[f[1]] {
			continue
		}
		switch f[0] {
		case "create":
			if _, ok := out[f[1]]; !ok {
				out[f[1]] = []string{}
			}
		case "add":
			if len(f) >= 3 {
				out[f[1]] = append(out[f[1]], f[2])
			}
		}
	}
	return out
}
