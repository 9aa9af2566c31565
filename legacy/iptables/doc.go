// Package iptables is kp's iptables mode (--proxy-mode iptables): it renders
// a proxy.State into chains named like upstream kube-proxy's, under a KP-
// prefix, and applies them with one iptables-restore --noflush per IP family
// per sync, rewriting after the first sync only the chains that changed.
//
// Both iptables backends are supported, iptables-nft and iptables-legacy,
// chosen as upstream's iptables-wrapper chooses (see Detect). The package is
// also the iptables writer of the ipvs and userspace modes.
package iptables
