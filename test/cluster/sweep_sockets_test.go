package cluster

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// A killed run's shim sockets, which nothing listens on, go; a live one
// (a system containerd's shim) stays.
func TestRemoveDeadSocketsKeepsTheLiveOnes(t *testing.T) {
	dir := t.TempDir()
	live, err := net.Listen("unix", filepath.Join(dir, "live"))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	dead, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "dead"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	dead.SetUnlinkOnClose(false) // as a killed shim leaves it
	dead.Close()
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	removeDeadSockets(dir)
	for name, want := range map[string]bool{"live": true, "dead": false, "file": true} {
		_, err := os.Lstat(filepath.Join(dir, name))
		if got := err == nil; got != want {
			t.Errorf("%s there after the sweep: %v, want %v", name, got, want)
		}
	}
}
