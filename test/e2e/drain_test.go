package e2e

import (
	"bufio"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// SIGTERM drains the mode that runs when kp stops, not the one kp started
// with: kp started in nftables mode and switched to userspace (kp migrate
// node) carries its connections itself, so on SIGTERM it stops accepting,
// lets an open connection finish, and exits once it has. Before the fix kp
// drained the backend it started with (nftables, nothing to drain) and
// exited at once, cutting the connection.
func TestSIGTERMAfterSwitchToUserspaceDrainsOpenConnections(t *testing.T) {
	netns.Require(t, "nft")
	e := newEnv(t, modeNFTables, 1)
	pods := e.w.Pods()
	streamServer(t, pods[0])
	e.write("stream.yaml", Service{Name: "stream", ClusterIPs: []string{"10.96.0.12"},
		Ports: []Port{{Name: "s", Port: 9000, TargetPort: 9090}}, Endpoints: endpoints(pods[0])})
	e.startKP()
	e.migrate("--to", "userspace")

	client := e.w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), slow(30*time.Second))
	defer cancel()
	conn, err := netns.DialConn(ctx, client, "tcp", streamTCP)
	if err != nil {
		t.Fatalf("connection to %s: %v", streamTCP, err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	echo := func(line string) error {
		_ = conn.SetDeadline(time.Now().Add(slow(3 * time.Second)))
		if _, err := fmt.Fprintf(conn, "%s\n", line); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if want := pods[0].Name + " " + line + "\n"; got != want {
			return fmt.Errorf("answer %q, want %q", got, want)
		}
		return nil
	}
	if err := echo("before"); err != nil {
		t.Fatalf("through userspace before SIGTERM: %v", err)
	}

	if err := e.kp.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Draining: kp keeps running and the open connection keeps working,
	// while new connections are refused (the listeners are closed).
	time.Sleep(time.Second)
	if !e.kp.Running() {
		t.Fatalf("kp exited within 1 s of SIGTERM with a connection open (%v): it did not drain the userspace mode it ran\nkp's log:\n%s",
			e.kp.ExitErr(), tail(e.kp.Log(), 30))
	}
	if err := echo("draining"); err != nil {
		t.Fatalf("the open connection broke while kp drained: %v\nkp's log:\n%s", err, tail(e.kp.Log(), 30))
	}
	if _, err := netns.Dial(client, "tcp", streamTCP, slow(2*time.Second)); err == nil {
		t.Errorf("a new connection was accepted while kp drained")
	} else if !isRefused(err) && !isTimeout(err) {
		t.Errorf("a new connection while kp drained: %v, want refused", err)
	}

	// The connection ends: kp exits well within its grace period.
	conn.Close()
	select {
	case <-e.kp.Done():
	case <-time.After(slow(10 * time.Second)):
		t.Fatalf("kp still running 10 s after the last connection closed\nkp's log:\n%s", tail(e.kp.Log(), 30))
	}
}
