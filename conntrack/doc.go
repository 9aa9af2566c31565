// Package conntrack reads and prunes the kernel's connection tracking table
// for kp: it lists and streams flows (github.com/ti-mo/conntrack), attributes
// each to the Service port it was addressed to and the endpoint that
// answers, and, after every sync, deletes the UDP and SCTP entries that would
// otherwise keep a client talking to an endpoint that is gone, or past a
// Service address that only now has endpoints.
//
// It imports proxy for the model types only; kp proxy hooks the Cleaner in
// as a proxy.SyncObserver.
package conntrack
