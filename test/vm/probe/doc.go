// Package probe holds the tests the VM harness's own test (test/vm) runs
// inside the VM: they prove the guest is the kernel kp's IPVS mode and the
// platform matrix need. Outside the VM (KP_VM unset) they skip.
package probe
