// Package legacy holds kp's fallback modes, one package each: iptables,
// ipvs and userspace. Each implements proxy.Backend; the iptables package is
// also the one place that speaks iptables, for the ipvs and userspace modes'
// iptables parts.
package legacy
