// Package proxy is kp's mode-independent core: the Service and Endpoint model,
// the sources that feed it (kube API, folder of manifests), change tracking into
// immutable State snapshots, the bounded-frequency sync runner, and the small
// Backend interface every mode implements.
package proxy
