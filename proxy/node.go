package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// LocalAddrs lists the addresses of the calling thread's network namespace
// (IPv4 ones unmapped): what a mode answers NodePorts on when told "every
// local address", and what kp flows calls local.
func LocalAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// NodeName returns the name the proxy runs as: hostnameOverride when set,
// otherwise the host name, lower-cased as upstream does.
func NodeName(hostnameOverride string) (string, error) {
	name := hostnameOverride
	if strings.TrimSpace(name) == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("node name: no --hostname-override and no host name: %w", err)
		}
		name = h
	}
	return strings.ToLower(strings.TrimSpace(name)), nil
}

// toBeDeletedTaint is the Cluster Autoscaler's taint on a node it is about to
// remove; upstream then fails /healthz so load balancers drain the node first.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"
