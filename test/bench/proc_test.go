package bench

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// A child still running the parent's program (before its exec) is not a
// helper; a child running another program is.
func TestChildHWMCountsHelpersNotTheProxysOwnImage(t *testing.T) {
	if os.Getenv("BENCH_CHILD") == "sleep" {
		time.Sleep(time.Minute)
		return
	}
	same := exec.Command(os.Args[0], "-test.run", "^TestChildHWMCountsHelpersNotTheProxysOwnImage$")
	same.Env = append(os.Environ(), "BENCH_CHILD=sleep")
	if err := same.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = same.Process.Kill(); _ = same.Wait() }()
	time.Sleep(300 * time.Millisecond)
	if got := childHWM(os.Getpid()); got != 0 {
		t.Errorf("child running the test binary itself counted as a helper: %d bytes", got)
	}
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	time.Sleep(300 * time.Millisecond)
	if got := childHWM(os.Getpid()); got <= 0 {
		t.Errorf("sleep child not counted")
	}
}
