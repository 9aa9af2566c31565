// Command pause is the real-node tests' sandbox ("pause") container: the
// process that holds a pod's namespaces open. It sleeps until SIGTERM or
// SIGINT and, being PID 1 of the pod when the pod shares its process
// namespace, reaps every child that exits. Built statically (CGO_ENABLED=0)
// into the image test/cluster gives containerd and the kubelet as their
// sandbox image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		// Reap every exited child; one SIGCHLD may stand for several.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
