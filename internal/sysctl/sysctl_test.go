package sysctl

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEnsureWritesOnlyADifferentValueAndReturnsTheOldOne(t *testing.T) {
	d := Dir(t.TempDir())
	p := d.Path("net.ipv4.vs.conntrack")
	if want := filepath.Join(string(d), "net", "ipv4", "vs", "conntrack"); p != want {
		t.Fatalf("Path = %s, want %s", p, want)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if old, err := d.Ensure("net.ipv4.vs.conntrack", "1"); old != "0" || err != nil {
		t.Errorf("Ensure = %q, %v; want old 0", old, err)
	}
	if v, err := d.Get("net.ipv4.vs.conntrack"); v != "1" || err != nil {
		t.Errorf("Get = %q, %v; want 1", v, err)
	}
	if err := os.Chmod(p, 0o444); err != nil {
		t.Fatal(err)
	}
	if old, err := d.Ensure("net.ipv4.vs.conntrack", "1"); old != "1" || err != nil {
		t.Errorf("Ensure of the value in force = %q, %v; want no write", old, err)
	}
	if _, err := d.Ensure("net.ipv4.vs.nope", "1"); !os.IsNotExist(err) {
		t.Errorf("Ensure of a missing sysctl = %v, want not-exist", err)
	}
}

func TestDefaultDirIsProcSys(t *testing.T) {
	if p := Dir("").Path("net.ipv4.conf.all.route_localnet"); p != "/proc/sys/net/ipv4/conf/all/route_localnet" {
		t.Errorf("Path = %s", p)
	}
}
