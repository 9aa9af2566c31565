// Package userspace is kp's mode of last resort: a Go L4 proxy. Each service
// port gets listeners (TCP or UDP) on ports the kernel picks, redirect rules
// send the Service's addresses to them (an nftables table of kp's own, ip/ip6
// kp-userspace; or, on a kernel without nftables NAT, iptables REDIRECT rules
// in KP-USERSPACE- chains written through legacy/iptables), and every
// connection is proxied to an endpoint chosen round robin, with ClientIP
// affinity and a retry on the next endpoint when a dial fails. It needs no
// conntrack NAT to endpoints; the client's address is not preserved
// (endpoints see the node).
package userspace
