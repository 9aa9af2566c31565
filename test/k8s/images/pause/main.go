// Command pause is the process of a pod's sandbox container (and of the e2e
// suite's pause image): it holds the pod's namespaces open, doing nothing.
// As the pod's PID 1 when the pod shares its process namespace it also
// reaps orphaned children, which the kernel reparents to it. It exits 0 on
// SIGTERM or SIGINT, which is how the runtime stops a sandbox.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (kp test image)")
		return
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited. Signals coalesce, so one
// SIGCHLD may stand for several children: loop until none is left.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
