package vm

import (
	"os"
	"testing"

	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

func TestEcho(t *testing.T) {
	out, err := Run(t, Options{Timeout: 2 * 60e9}, "/bin/sh", "-c", "uname -r; cat /proc/modules | wc -l; ip link add d0 type dummy && ip -br link; exit 3")
	t.Logf("out=%q err=%v", out, err)
}
