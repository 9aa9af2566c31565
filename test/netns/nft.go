package netns

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

func nft(ns string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("nft %s in %s: %w: %s", strings.Join(args, " "), ns, err, bytes.TrimSpace(stderr.Bytes()))
	}
	if s := bytes.TrimSpace(stderr.Bytes()); len(s) > 0 {
		return stdout.String(), fmt.Errorf("nft %s in %s wrote to stderr: %s", strings.Join(args, " "), ns, s)
	}
	return stdout.String(), nil
}
