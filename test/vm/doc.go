// Package vm runs a test binary on a second kernel: Debian 12's
// linux-image-cloud-amd64 (6.1, which has IPVS and the dummy driver that
// the host's kernel lacks), booted with qemu in software emulation, one boot
// per call.
//
// The guest runs the host's own userland: the host's / is shared read-only
// with virtiofsd (the cloud kernel has no 9p; it has virtiofs), with tmpfs
// overlays on the folders that must be writable, so the same nft, iptables,
// ip and the same `go test -c` binaries run inside without an image. The
// kernel is fetched by kernel.sh (apt-get download, dpkg -x) into the cache
// test/k8s uses; kp-vm-init is the guest's PID 1 and modprobe.
package vm
