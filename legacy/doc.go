// Package legacy holds kp's fallback modes, one package each: iptables,
// ipvs and userspace. Each implements proxy.Backend; the iptables package is
// also the one place that speaks iptables, for the ipvs and userspace modes'
// iptables parts. README.md beside this file sketches each mode's sync
// (render, diff, apply) and names the file of each step.
package legacy
