// Package userspace is kp's mode of last resort: a Go L4 proxy. Each service
// port gets listeners (TCP or UDP) on ports the kernel picks, an nftables
// table of kp's own (ip/ip6 kp-userspace) redirects the Service's addresses
// to them, and every connection is proxied to an endpoint chosen round
// robin, with ClientIP affinity and a retry on the next endpoint when a dial
// fails. It works wherever nftables can redirect, without conntrack NAT to
// endpoints; the client's address is not preserved (endpoints see the node).
package userspace
